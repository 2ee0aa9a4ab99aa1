"""The Celery app a solo worker runs in the cold-shutdown test
(``celery -A tests.support.cold_shutdown_app:app``).

One task, ``chaos.work`` (the name and arguments :class:`effectq.testing.workers.Producer`
sends), calls one effect. The effect applies to the ledger, then, on its first
execution only, says so and works on until the test sends the worker SIGQUIT. The
app is :func:`tests.support.worker_app.worker_app`'s, without a result backend.
"""

from __future__ import annotations

import os
import time
from typing import Any

import effectq
from tests.support.worker_app import env, worker_app

app, ledger, name, lease = worker_app("cold", results=False)


@effectq.effect(name="cold.charge", lease=lease)
def charge(order: int) -> str:
    ctx = effectq.current_effect()
    value = ledger.apply(f"charge:{order}", idempotency_key=ctx.idempotency_key, token=ctx.token)
    if ledger.arm(f"hold:{order}"):
        ledger.note("applied", order=order, pid=os.getpid())
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:  # still working when the worker is told to stop
            time.sleep(0.05)
    return value


_options: dict[str, Any] = {}
if env("keyed_by") == "business":  # sent again under a new task id: the same run
    _options["effectq_run_id"] = "order:{task_no}"
else:  # Celery's autoretry sends the task again under its own id
    _options.update(autoretry_for=(Exception,), max_retries=3, default_retry_delay=0)


@app.task(name="chaos.work", bind=True, shared=False, **_options)  # type: ignore[untyped-decorator]
def work(self: Any, task_no: int, *_: Any) -> None:
    ledger.note("start", task=task_no, retries=self.request.retries or 0, pid=os.getpid())
    try:
        charge(task_no)
    except effectq.OutcomeUnknown as exc:
        ledger.note("unknown", task=task_no, key=exc.key)
        raise
    except Exception as exc:
        ledger.note("failed", task=task_no, error=repr(exc))
        raise
    ledger.note("done", task=task_no)
