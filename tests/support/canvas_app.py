"""The Celery app the canvas tests run in real workers (``celery -A tests.support.canvas_app:app``).

Chord header tasks (``canvas.part``), a chord callback keyed by the chord's group id
(``canvas.total``) and chain steps (``canvas.step``) each apply one effect to the ledger
and note the request fields they saw. A task given ``hold=True`` waits, on its first
delivery only and after its effect, for the test to SIGKILL the worker. The Redis broker
and the Redis result backend share the run's key prefix, so the test deletes all of it.
The configuration comes from the environment :class:`~effectq.chaos.workload.WorkloadConfig`
writes (read here without importing that module, whose app would be built too).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

import effectq
import effectq.celery
from effectq.testing.ledger import Ledger


def _env(name: str) -> str:
    return os.environ["EFFECTQ_CHAOS_" + name.upper()]


name, lease = _env("name"), float(_env("lease"))
prefix = f"effectq-chaos-{name}:"
ledger = Ledger.from_url(_env("ledger"), name)


app = Celery(f"effectq-canvas-{name}", broker=_env("broker"), backend=_env("store"))
app.conf.update(
    result_backend_transport_options={"global_keyprefix": prefix},
    result_expires=3600,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_default_queue=f"effectq-chaos-{name}",
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(_env("visibility")),
        "unacked_restore_interval": 1,  # a live worker restores a dead one's tasks every second
        "unacked_restore_throttle": 1,
        "global_keyprefix": prefix,
    },
)
effectq.celery.install(app, _env("store"), namespace=name, in_progress_countdown=1.0, lease=lease)


@effectq.effect(name="canvas.apply", lease=lease)
def apply(identity: str) -> str:
    ctx = effectq.current_effect()
    return ledger.apply(identity, idempotency_key=ctx.idempotency_key, token=ctx.token)


def note(kind: str, task: Any, **fields: Any) -> None:
    request = task.request
    run = effectq.active_run()
    stats = run.stats if run is not None else None
    ledger.note(
        kind,
        id=request.id,
        group=request.group,
        root=request.root_id,
        parent=request.parent_id,
        run=run.id if run is not None else None,
        executed=stats.executed if stats else 0,
        replayed=stats.replayed if stats else 0,
        **fields,
    )


def hold_once(tag: str) -> None:
    if ledger.arm(tag):
        ledger.note("armed", tag=tag)
        time.sleep(600)  # until the test kills this worker


@app.task(name="canvas.part", bind=True, shared=False)  # type: ignore[untyped-decorator]
def part(self: Any, n: int) -> int:
    apply(f"part:{n}")
    note("part", self, n=n)
    return n


@app.task(name="canvas.total", bind=True, shared=False, effectq_run_id="chord:{request.group}")  # type: ignore[untyped-decorator]
def total(self: Any, results: list[int], hold: bool = False) -> int:
    note("total-start", self)
    apply("total")
    if hold:
        hold_once("total")
    note("total-done", self, results=sorted(results))
    return sum(results)


@app.task(name="canvas.step", bind=True, shared=False)  # type: ignore[untyped-decorator]
def step(self: Any, x: int, n: int, hold: bool = False) -> int:
    apply(f"step:{n}")
    if hold:
        hold_once(f"step:{n}")
    note("step-done", self, n=n)
    return x + 1
