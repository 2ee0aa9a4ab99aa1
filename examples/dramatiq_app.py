"""A Dramatiq app whose actors charge and email once per order, whatever the broker redelivers.

Run a worker, then send an order (RabbitMQ at 127.0.0.1:5672 and Redis at 127.0.0.1:6379,
or set EXAMPLE_AMQP / EXAMPLE_REDIS):

    dramatiq examples.dramatiq_app
    python -m examples.dramatiq_app 42

Kill the worker (kill -9) while it works and start it again: RabbitMQ delivers the
message again and the charge is replayed, not repeated (see ``examples/shop.py``).
"""

from __future__ import annotations

import os
import sys
import time

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from effectq.dramatiq import EffectMiddleware
from examples.shop import PAUSE, REDIS, charge, email_receipt

AMQP = os.environ.get("EXAMPLE_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2F")

broker = RabbitmqBroker(url=AMQP)
broker.add_middleware(EffectMiddleware(REDIS, namespace="example-shop"))  # the one line effectq needs
dramatiq.set_broker(broker)


@dramatiq.actor(effectq_run_id="order:{order_id}", max_retries=10)
def fulfil(order_id: int) -> None:
    """Charge, wait a little (kill the worker now), then send the receipt."""
    charge_id = charge(order_id, 1999)
    time.sleep(PAUSE)
    email_receipt(order_id, charge_id)


if __name__ == "__main__":
    fulfil.send(int(sys.argv[1]) if len(sys.argv) > 1 else 42)
    print("sent; read the outbox with: redis-cli lrange examples:outbox 0 -1")
