"""The Celery app of the pool tests' real workers (``celery -A tests.support.pools_app:app -P ...``).

One task, ``pools.hold(task_no, mode, release)``, run by the business key ``pools:{task_no}``,
calls one effect that holds until the test creates the file ``release``: in
``"cpu"`` mode it spins on ``os.stat`` (a system call no pool's patching turns into a yield,
so under gevent or eventlet no other greenlet runs meanwhile), in ``"io"`` mode it sleeps in
short steps (``time.sleep``, which gevent and eventlet patch into a yield to their hub).
The effect notes ``holding`` with its key and token when it starts; the task notes ``done``
with the effect's value and whether its lease was lost, as the effect saw it before returning.
"""

from __future__ import annotations

import os
import time

import effectq
from tests.support.worker_app import worker_app

app, ledger, name, lease = worker_app("pools", results=False)


@effectq.effect(name="pools.hold", lease=lease)
def hold(task_no: int, mode: str, release: str) -> str:
    ctx = effectq.current_effect()
    ledger.note("holding", task=task_no, mode=mode, key=ctx.key, token=ctx.token, pid=os.getpid())
    if mode == "cpu":
        while not os.path.exists(release):  # holds the CPU: nothing here yields to a green hub
            pass
    else:
        while not os.path.exists(release):
            time.sleep(0.02)
    lost = ctx.lease_lost
    return f"held:{task_no}:{mode}:{int(lost)}"


@app.task(name="pools.hold", effectq_run_id="pools:{task_no}")  # type: ignore[untyped-decorator]
def hold_task(task_no: int, mode: str, release: str) -> None:
    try:
        value = hold(task_no, mode, release)
    except Exception as exc:
        ledger.note("failed", task=task_no, error=repr(exc))
        raise
    ledger.note("done", task=task_no, value=value)
