"""The Celery app of a test's real worker, built from the environment a
:class:`~effectq.chaos.workload.WorkloadConfig` writes (``EFFECTQ_CHAOS_*``).

Read without importing that module: it would build its own app, whose shared tasks of the
same names would take the test app's place. The worker takes one task at a time, acks late,
and a live worker restores a dead one's tasks every second; every broker (and backend) key
carries the run's prefix, so the test deletes all of it.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from celery import Celery

import effectq.celery
from effectq.testing.ledger import Ledger


def env(name: str) -> str:
    """One field of the configuration: ``env("lease")`` reads ``EFFECTQ_CHAOS_LEASE``."""
    return os.environ["EFFECTQ_CHAOS_" + name.upper()]


class WorkerApp(NamedTuple):
    app: Celery
    ledger: Ledger
    name: str
    lease: float


def worker_app(title: str, *, results: bool) -> WorkerApp:
    """The app, effectq installed; ``results``: a Redis result backend (else results are ignored)."""
    name, lease = env("name"), float(env("lease"))
    prefix = f"effectq-chaos-{name}:"
    app = Celery(f"effectq-{title}-{name}", broker=env("broker"), backend=env("store") if results else None)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_default_queue=f"effectq-chaos-{name}",
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": float(env("visibility")),
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
            "global_keyprefix": prefix,
        },
    )
    if results:
        app.conf.update(result_backend_transport_options={"global_keyprefix": prefix}, result_expires=3600)
    else:
        app.conf.task_ignore_result = True
    effectq.celery.install(app, env("store"), namespace=name, in_progress_countdown=1.0, lease=lease)
    return WorkerApp(app, Ledger.from_url(env("ledger"), name), name, lease)
