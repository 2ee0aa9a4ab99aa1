"""The Celery app the canvas tests run in real workers (``celery -A tests.support.canvas_app:app``).

Chord header tasks (``canvas.part``), a chord callback keyed by the chord's group id
(``canvas.total``) and chain steps (``canvas.step``) each apply one effect to the ledger
and note the request fields they saw. A task given ``hold=True`` waits, on its first
delivery only and after its effect, for the test to SIGKILL the worker. The Redis broker
and the Redis result backend share the run's key prefix, so the test deletes all of it.
The app is :func:`tests.support.worker_app.worker_app`'s, with a result backend.
"""

from __future__ import annotations

import time
from typing import Any

import effectq
from tests.support.worker_app import worker_app

app, ledger, name, lease = worker_app("canvas", results=True)


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
