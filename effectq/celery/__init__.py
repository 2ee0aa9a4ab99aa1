"""effectq for Celery: add it to a worker app in one line.

    import effectq.celery

    app = Celery("shop", broker="redis://127.0.0.1:6379/1")
    app.conf.task_acks_late = True
    app.conf.task_reject_on_worker_lost = True
    effectq.celery.install(app, "redis://127.0.0.1:6379/0", namespace="shop")

    @app.task(bind=True)
    def fulfil(self, order_id):
        charge(order_id)        # an @effectq.effect: applies once per task id
        send_receipt(order_id)  # a redelivered task replays what already applied

Task options (keyword arguments of ``@app.task``):

* ``effectq_run_id="order:{order_id}"`` (or a function of the task's arguments):
  key the run by a business key instead of the task id, for work that may be
  enqueued twice under two task ids. ``{request.group}``, ``{request.root_id}``,
  ``{request.parent_id}`` and ``{request.id}`` name the delivery
  (``"chord:{request.group}"``: a chord callback's effects once per chord), and a
  function ``(args, request)`` gets both.
* ``effectq_task=True`` (or a mapping of :func:`effectq.effect` options): the whole
  task is an effect; a redelivered task that completed returns its recorded value
  and the body does not run.

``effectq.celery.install(app)`` without a store reads ``effectq_url``,
``effectq_namespace`` and the other options from the app's configuration
(``CELERY_EFFECTQ_URL`` under ``config_from_object(..., namespace="CELERY")``), else
``EFFECTQ_URL`` / ``EFFECTQ_NAMESPACE``.

Needs ``pip install 'effectq[celery]'``.
"""

from __future__ import annotations

try:
    import celery as _celery  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("effectq.celery needs Celery: pip install 'effectq[celery]'") from exc

from .checks import check
from .installation import Installation, install

__all__ = ["Installation", "check", "install"]
