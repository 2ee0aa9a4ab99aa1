"""The Celery app bench/e2e.py runs in a real worker: one task, three effects.

EFFECTQ_BENCH_URL names the Redis (store in db 0, broker in db 1);
EFFECTQ_BENCH_GUARD=1 installs effectq, 0 runs the same task without it.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

import effectq

URL = os.environ["EFFECTQ_BENCH_URL"]
GUARDED = os.environ.get("EFFECTQ_BENCH_GUARD") == "1"
QUEUE = os.environ.get("EFFECTQ_BENCH_QUEUE", "bench")
WORK = float(os.environ.get("EFFECTQ_BENCH_WORK_MS", "0")) / 1000
"""How long each effect's side effect takes (an API call, say); 0: the effects do nothing."""

app = Celery("e2e", broker=URL.rsplit("/", 1)[0] + "/1")
app.conf.task_acks_late = True
app.conf.task_default_queue = QUEUE
app.conf.worker_prefetch_multiplier = 4
counter = redis.Redis.from_url(URL)

if GUARDED:
    import effectq.celery

    effectq.celery.install(app, URL, namespace=f"bench-{QUEUE}")


def reserve(order: int) -> dict[str, int]:
    if WORK:  # time.sleep(0) is no no-op: a syscall, and tens of µs on some VMs
        time.sleep(WORK)
    return {"order": order, "reserved": 1}


def charge(order: int) -> dict[str, int]:
    if WORK:  # time.sleep(0) is no no-op: a syscall, and tens of µs on some VMs
        time.sleep(WORK)
    return {"order": order, "charged": 1}


def notify(order: int) -> dict[str, int]:
    if WORK:  # time.sleep(0) is no no-op: a syscall, and tens of µs on some VMs
        time.sleep(WORK)
    return {"order": order, "notified": 1}


if GUARDED:
    reserve = effectq.effect(name="bench.reserve")(reserve)
    charge = effectq.effect(name="bench.charge")(charge)
    notify = effectq.effect(name="bench.notify")(notify)


@app.task(name="bench.fulfil")
def fulfil(order: int, batch: int) -> int:
    reserve(order)
    charge(order)
    notify(order)
    if counter.incr(f"{QUEUE}:done") == batch:  # the batch's last task: the sender stops its clock
        counter.rpush(f"{QUEUE}:finished", order)
    return order
