"""A Celery app whose tasks charge and email once per order, whatever the broker redelivers.

Run a worker, then send an order (Redis at 127.0.0.1:6379, or set EXAMPLE_REDIS / EXAMPLE_BROKER):

    celery -A examples.celery_app worker -l INFO
    python -m examples.celery_app 42

Kill the worker (kill -9) while it works and start it again: the task is delivered again
after the visibility timeout (30 s here) and replays the charge instead of charging twice
(see ``examples/shop.py``).
"""

from __future__ import annotations

import os
import sys
import time

from celery import Celery

import effectq.celery
from examples.shop import PAUSE, REDIS, charge, email_receipt

BROKER = os.environ.get("EXAMPLE_BROKER", REDIS)

app = Celery("shop", broker=BROKER)
app.conf.update(
    task_acks_late=True,  # a task is acked after it ran, so a dead worker's task is delivered again
    task_reject_on_worker_lost=True,
    task_time_limit=20,
    broker_transport_options={"visibility_timeout": 30},  # a dead worker's task comes back after 30 s
)
effectq.celery.install(app, REDIS, namespace="example-shop")  # the one line effectq needs


@app.task(name="shop.fulfil", bind=True, effectq_run_id="order:{order_id}")
def fulfil(self: object, order_id: int) -> str:
    """Charge, wait a little (kill the worker now), then send the receipt."""
    charge_id = charge(order_id, 1999)
    time.sleep(PAUSE)
    email_receipt(order_id, charge_id)
    return charge_id


if __name__ == "__main__":
    fulfil.delay(int(sys.argv[1]) if len(sys.argv) > 1 else 42)
    print("sent; read the outbox with: redis-cli lrange examples:outbox 0 -1")
