"""The Celery app a solo worker runs in the cold-shutdown test
(``celery -A tests.support.cold_shutdown_app:app``).

One task, ``chaos.work`` (the name and arguments :class:`effectq.testing.workers.Producer`
sends), calls one effect. The effect applies to the ledger, then, on its first
execution only, says so and works on until the test sends the worker SIGQUIT. The
configuration comes from the environment :class:`~effectq.chaos.workload.WorkloadConfig`
writes, read here without importing that module (it would build its own app, whose
shared task of the same name would take this one's place).
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


name, queue, lease = _env("name"), f"effectq-chaos-{_env('name')}", float(_env("lease"))
ledger = Ledger.from_url(_env("ledger"), name)

app = Celery(f"effectq-cold-{name}", broker=_env("broker"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    task_ignore_result=True,
    task_default_queue=queue,
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "visibility_timeout": float(_env("visibility")),
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
        "global_keyprefix": f"effectq-chaos-{name}:",
    },
)
effectq.celery.install(app, _env("store"), namespace=name, in_progress_countdown=1.0, lease=lease)


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
if _env("keyed_by") == "business":  # sent again under a new task id: the same run
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
