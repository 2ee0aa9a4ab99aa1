"""The Dramatiq middleware: every message's actor runs inside a run keyed by its message id.

Dramatiq's contract shapes this module (see ``Broker.emit_before`` / ``emit_after``):

* ``before_process_message`` may stop a message only by raising a
  ``MiddlewareError``; anything else is logged and the actor runs anyway. So every
  failure here (a store that does not answer, a run id that cannot be made) is
  raised as :class:`RunNotBoundError`, a ``MiddlewareError``: the actor does not
  run, and the Retries middleware retries the message.
* ``after_process_message`` errors are swallowed, so nothing that matters for
  safety happens there: a whole-actor effect records its result inside the actor
  call itself; the after hook only unbinds the run and logs, guarding its own errors.
* The run binding is a :class:`contextvars.ContextVar`: it is per worker thread,
  and an async actor (the AsyncIO middleware) sees it because its coroutine is
  scheduled from the worker thread with a copy of that thread's context.
"""

from __future__ import annotations

import logging
import threading
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, NamedTuple

import dramatiq
from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage

from .._runtime.leases import heartbeat
from ..errors import EffectqError
from ..integration import STOPS_TASK, StoreSource, log_finished, run_id_for, task_effect, task_key
from ..options import seconds
from ..runs import RunScope
from ..runs import run as bind_run
from ..store.base import Status, Store
from .checks import ACTOR_OPTIONS, check

__all__ = ["EffectMiddleware", "RunNotBoundError"]

log = logging.getLogger("effectq.dramatiq")
log_skip = logging.getLogger("effectq.dramatiq.skip")
log_unknown = logging.getLogger("effectq.dramatiq.unknown")


class RunNotBoundError(MiddlewareError, EffectqError):
    """effectq could not bind the run of a message, so the actor did not run.

    Attributes:
        message_id: the message.
    """

    def __init__(self, message_id: str, reason: str) -> None:
        self.message_id = message_id
        super().__init__(
            f"effectq could not bind the run of message {message_id} ({reason}); the actor did not run"
        )
        self.reason = reason
        self._rebuilt_from(message_id, reason)


class _Bound(NamedTuple):
    message_id: str
    scope: RunScope


_bound: ContextVar[_Bound | None] = ContextVar("effectq.dramatiq.bound", default=None)


class EffectMiddleware(Middleware):
    """Bind a run for every message: run id = ``message.message_id``, stable across retries.

    Add it before declaring actors that use its options (Dramatiq checks actor
    options at declaration), and after ``Retries`` (the default place):

        broker.add_middleware(EffectMiddleware("redis://127.0.0.1:6379/0", namespace="shop"))

    Actor options:

    * ``effectq_run_id="order:{order_id}"`` (or a function of the actor's
      arguments): key the run by a business key instead of the message id.
    * ``effectq_task=True`` (or a mapping of :func:`effectq.effect` options): the
      whole actor is an effect. A message whose actor already completed is skipped
      (``SkipMessage``); when its return value is wanted (a pipeline, the Results
      middleware) the recorded value is returned instead and the body does not run.

    An :class:`~effectq.OutcomeUnknown`, :class:`~effectq.AttemptsExhausted` or
    :class:`~effectq.RecordedFailure` (:data:`~effectq.integration.STOPS_TASK`) fails the
    message (dead-lettered, not retried): a retry would only raise it again;
    an :class:`~effectq.InProgress` is retried by the Retries middleware.

    When a worker boots, the set-up is checked and each problem logged (see
    :func:`effectq.dramatiq.check`).

    Args:
        store: an effectq store, or a ``redis://`` URL (each worker process builds its own).
        namespace: the namespace of a store built from a URL.
        retention: the shortest effect retention the actors' effects use (for the check).
        **redis_options: passed to :meth:`effectq.RedisStore.from_url`.
    """

    def __init__(
        self,
        store: Store | str,
        *,
        namespace: str = "default",
        retention: float | timedelta = timedelta(days=7),
        **redis_options: Any,
    ) -> None:
        self.source = StoreSource(store, namespace=namespace, **redis_options)
        self.retention = seconds(retention, option="retention")
        self._wrap_lock = threading.Lock()

    @property
    def actor_options(self) -> set[str]:
        return set(ACTOR_OPTIONS)

    @property
    def store(self) -> Store:
        """This process's store."""
        return self.source.get()

    # -- declaration and boot ------------------------------------------------------------

    def after_declare_actor(self, broker: dramatiq.Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        spec = actor.options.get("effectq_task")
        if not spec:
            return
        with self._wrap_lock:
            if getattr(actor.fn, "__effectq_task__", False):
                return
            wrapped = task_effect(actor.fn, actor.actor_name, spec)
            wrapped.__effectq_task__ = True  # type: ignore[attr-defined]
            actor.fn = wrapped

    def before_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
        """Log each problem :func:`~effectq.dramatiq.check` finds (what fails here Dramatiq logs;
        the worker boots anyway)."""
        with self.source.probe() as store:
            problems = check(broker, retention=self.retention, store=store)
        for problem in problems:
            log.warning("effectq: %s", problem)

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: Any) -> None:
        """Writes the heartbeat still retries get one more try; each that does not land is logged
        with what to do (a forked worker process ends without running ``atexit``)."""
        heartbeat.settle_repairs(why="the worker shut down")

    # -- each message ------------------------------------------------------------------

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        try:
            actor = broker.get_actor(message.actor_name)
            run_id = run_id_for(
                actor.options.get("effectq_run_id"),
                actor.fn,
                message.args,
                message.kwargs,
                default=message.message_id,
                task=actor.actor_name,
            )
            store = self.source.get()
            if actor.options.get("effectq_task"):
                self._skip_if_completed(broker, message, store, task_key(run_id, actor.actor_name))
            scope = bind_run(
                run_id,
                store=store,
                actor=actor.actor_name,
                message_id=message.message_id,
                retries=message.options.get("retries", 0),
            )
        except SkipMessage:
            raise
        except Exception as exc:
            raise RunNotBoundError(message.message_id, f"{type(exc).__name__}: {exc}") from exc
        scope.__enter__()
        _bound.set(_Bound(message.message_id, scope))

    def _skip_if_completed(self, broker: dramatiq.Broker, message: Any, store: Store, key: str) -> None:
        if message.options.get("pipe_target") is not None or _has_results(broker):
            return  # the body replays the recorded value for whoever wants it
        record = store.get(key)
        if record is not None and record.status is Status.COMPLETED:
            log_skip.info(
                "effectq actor %s already completed for message %s (key %s); skipping the redelivery",
                message.actor_name,
                message.message_id,
                key,
            )
            raise SkipMessage(f"effectq: {key} already completed")

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: Any,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        try:
            if isinstance(exception, STOPS_TASK):
                _stop(broker, message, exception)
        except Exception:
            log.exception("effectq could not stop message %s after %r", message.message_id, exception)
        self._unbind(message)

    def after_skip_message(self, broker: dramatiq.Broker, message: Any) -> None:
        self._unbind(message)

    def _unbind(self, message: Any) -> None:
        top = _bound.get()
        if top is None or top.message_id != message.message_id:
            return
        _bound.set(None)
        try:
            top.scope.__exit__(None, None, None)
            bound = top.scope.run
            log_finished(
                bound,
                f"actor {message.actor_name}[{message.message_id}]",
                redelivered=bool(bound.metadata.get("retries")),
            )
        except Exception:  # Dramatiq would swallow it; say what happened instead
            log.exception("effectq could not unbind the run of message %s", message.message_id)


def _stop(broker: dramatiq.Broker, message: Any, exc: EffectqError) -> None:
    """Make Retries fail the message instead of retrying it: ``exc`` (one of ``STOPS_TASK``)
    waits for a person.

    Retries reads ``throws`` from the message options first; adding ``STOPS_TASK`` there makes
    it fail (dead-letter) the message at once.
    """
    actor = broker.get_actor(message.actor_name)
    throws = message.options.get("throws") or actor.options.get("throws") or ()
    if not isinstance(throws, tuple):
        throws = (throws,)
    message.options["throws"] = (*STOPS_TASK, *throws)
    log_unknown.error(
        "effectq actor %s stopped on message %s: %s. The message is failed, not retried; "
        "send it again once that is done.",
        message.actor_name,
        message.message_id,
        str(exc).rstrip("."),
    )


def _has_results(broker: dramatiq.Broker) -> bool:
    return any(type(m).__name__ == "Results" for m in broker.middleware)
