"""The Celery app bench/e2e.py runs in a real worker: one task, three effects (or the first one).

EFFECTQ_BENCH_URL names the Redis (store in db 0, broker in db 1);
EFFECTQ_BENCH_LAYER says what guards each effect:

* ``none``: nothing (the task as it would run without any idempotency layer);
* ``effectq``: effectq installed on the app, each function an effect;
* ``floor``: the least any layer that records its claim and its result can do:
  ``SET key NX`` before the function, ``SET key result`` after it, on redis-py
  (no fencing, no lease renewal, no unknown: a crash between the two replays silently);
* ``powertools``: AWS Lambda Powertools' ``idempotent_function`` with its Redis layer.
"""

from __future__ import annotations

import functools
import json
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery, current_task

import effectq

URL = os.environ["EFFECTQ_BENCH_URL"]
LAYER = os.environ.get("EFFECTQ_BENCH_LAYER", "none")
QUEUE = os.environ.get("EFFECTQ_BENCH_QUEUE", "bench")
WORK = float(os.environ.get("EFFECTQ_BENCH_WORK_MS", "0")) / 1000
"""How long each effect's side effect takes (an API call, say); 0: the effects do nothing."""
EFFECTS = int(os.environ.get("EFFECTQ_BENCH_EFFECTS", "3"))
"""How many effects the task runs: 3 (reserve, charge, notify), or 1 (charge alone: most tasks
do one side effect)."""

LAYERS = ("none", "effectq", "effectq-polling", "floor", "powertools")
POLL = 0.0002
"""``poll_replies`` of the ``effectq-polling`` layer: effectq with its replies polled for 200 µs."""
if LAYER not in LAYERS:
    raise SystemExit(f"EFFECTQ_BENCH_LAYER must be one of {', '.join(LAYERS)}, not {LAYER!r}")
if EFFECTS not in (1, 3):
    raise SystemExit(f"EFFECTQ_BENCH_EFFECTS must be 1 or 3, not {EFFECTS}")

app = Celery("e2e", broker=URL.rsplit("/", 1)[0] + "/1")
app.conf.task_acks_late = True
app.conf.task_default_queue = QUEUE
app.conf.worker_prefetch_multiplier = 4
counter = redis.Redis.from_url(URL)

if LAYER in ("effectq", "effectq-polling"):
    import effectq.celery

    polling = {"poll_replies": POLL} if LAYER == "effectq-polling" else {}
    effectq.celery.install(app, URL, namespace=f"bench-{QUEUE}", **polling)


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


Guard = Callable[[Callable[[int], dict[str, int]]], Callable[[int], Any]]


def _floor(fn: Callable[[int], dict[str, int]]) -> Callable[[int], Any]:
    """Two plain round trips around the function: the claim, then the result."""
    prefix = f"floor:{QUEUE}:{fn.__name__}:"

    @functools.wraps(fn)
    def guarded(order: int) -> Any:
        key = prefix + current_task.request.id
        if not counter.set(key, b"", nx=True, px=60_000):  # taken: never in this benchmark
            return json.loads(counter.get(key) or b"null")
        result = fn(order)
        counter.set(key, json.dumps(result), px=7 * 24 * 3600 * 1000)
        return result

    return guarded


def _powertools(fn: Callable[[int], dict[str, int]]) -> Callable[[int], Any]:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
    from aws_lambda_powertools.utilities.idempotency.persistence import redis as pt_redis

    layer_class = getattr(pt_redis, "CachePersistenceLayer", None) or pt_redis.RedisCachePersistenceLayer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = layer_class(client=counter)
    config = IdempotencyConfig(expires_after_seconds=7 * 24 * 3600)
    warnings.simplefilter("ignore")  # Powertools warns on every call outside Lambda

    @idempotent_function(data_keyword_argument="payload", persistence_store=layer, config=config)
    def keyed(payload: dict[str, Any]) -> dict[str, int]:
        return fn(payload["order"])

    @functools.wraps(fn)
    def guarded(order: int) -> Any:
        return keyed(payload={"effect": fn.__name__, "task": current_task.request.id, "order": order})

    return guarded


def _effect(fn: Callable[[int], dict[str, int]]) -> Callable[[int], Any]:
    return effectq.effect(name=f"bench.{fn.__name__}")(fn)


GUARDS: dict[str, Guard] = {
    "effectq": _effect,
    "effectq-polling": _effect,
    "floor": _floor,
    "powertools": _powertools,
}
if LAYER in GUARDS:
    reserve, charge, notify = (GUARDS[LAYER](fn) for fn in (reserve, charge, notify))


@app.task(name="bench.fulfil")
def fulfil(order: int, batch: int) -> int:
    if EFFECTS == 1:
        charge(order)
    else:
        reserve(order)
        charge(order)
        notify(order)
    if counter.incr(f"{QUEUE}:done") == batch:  # the batch's last task: the sender stops its clock
        counter.rpush(f"{QUEUE}:finished", order)
    return order
