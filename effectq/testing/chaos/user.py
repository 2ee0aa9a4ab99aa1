"""Chaos on your own tasks: your Celery app or Dramatiq broker module, unchanged, under the kill loop.

``effectq chaos --app examples.celery_app --send 'shop.fulfil({unique})'`` imports your module
(``module`` or ``module:attribute``, as ``celery -A`` and ``dramatiq`` take it), sends the tasks
you name with the arguments you give, and runs real workers of your app through this module:
it imports yours and adds only bookkeeping, never a change to your tasks.

* The workers consume a queue of the run's own (Celery: every task is sent to it); a Dramatiq
  actor's own queue (its ``queue_name``) is used as it is.
* What the run counts comes from effectq's events (:mod:`effectq.events`): each effect whose
  function ran and returned (``executed``) is one application on the run's ledger, by its
  effect key. An effect applied twice under one key is a duplicate. (A worker killed after a
  side effect but before its function returned leaves no event: the ledger counts what
  effectq saw, not the remote side, which only your own reconcile hook can ask.)
* Task starts and ends come from Celery's ``task_prerun`` / ``task_postrun`` signals and a
  Dramatiq middleware, so the runner can tell redeliveries, copies and unfinished tasks.

In a ``--send`` template, ``{n}`` is the task's number in the run (0, 1, ...) and ``{unique}``
a number unique to this task and run (so a business key such as ``order:{order_id}`` names a new
order each run, not one an earlier run already settled).
"""

from __future__ import annotations

import ast
import importlib
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import effectq.events
from effectq.testing.ledger import Ledger

from .config import WorkloadConfig

__all__ = ["Send", "Target", "UserProducer", "app", "broker", "load", "parse_send"]

APP_ENV = "EFFECTQ_CHAOS_APP"
"""The environment variable naming the user's module (``module`` or ``module:attribute``)."""
_TASK_ID = "effectq-chaos-{name}-{n}"
_OPTION = "effectq_chaos_task"


@dataclass(frozen=True, slots=True)
class Send:
    """One ``--send`` template: ``name(args...)`` with ``{n}`` and ``{unique}`` filled per task."""

    template: str

    def call(self, n: int, unique: int) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        """The task name, positional and keyword arguments of task number ``n``."""
        text = self.template.replace("{n}", str(n)).replace("{unique}", str(unique))
        try:
            node = ast.parse(text.strip(), mode="eval").body
            if not isinstance(node, ast.Call):
                raise ValueError("not a call")
            name = ast.unparse(node.func)
            args = tuple(ast.literal_eval(a) for a in node.args)
            kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
        except (SyntaxError, ValueError) as exc:
            raise ValueError(
                f"--send {self.template!r}: expected task_name(literal arguments...), e.g. "
                f"'shop.fulfil({{unique}})' ({exc})"
            ) from None
        return name, args, kwargs


def parse_send(text: str) -> Send:
    """Check a ``--send`` template (raises ValueError with the reason)."""
    send = Send(text)
    send.call(0, 0)
    return send


@dataclass(frozen=True, slots=True)
class Target:
    """The user's app: ``kind`` (``celery`` or ``dramatiq``), the object, and its broker's kind."""

    spec: str
    kind: str
    obj: Any
    broker: str

    @property
    def configuration(self) -> str:
        return f"{self.kind}-{self.broker}"


def load(spec: str) -> Target:
    """Import ``module`` or ``module:attribute`` and find the Celery app or Dramatiq broker in it."""
    module_name, _, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    candidates = [getattr(module, attribute)] if attribute else list(vars(module).values())
    for obj in candidates:
        if type(obj).__module__.startswith("celery") and hasattr(obj, "send_task"):
            transport = str(obj.conf.broker_url or "amqp://").split("://", 1)[0]
            return Target(spec, "celery", obj, "rabbitmq" if "amqp" in transport else "redis")
    for obj in candidates:
        if type(obj).__module__.startswith("dramatiq.brokers") and hasattr(obj, "get_actor"):
            return Target(
                spec, "dramatiq", obj, "rabbitmq" if "rabbitmq" in type(obj).__module__ else "redis"
            )
    raise ValueError(f"--app {spec}: no Celery app or Dramatiq broker found in {module_name}")


def task_number(task_id: str, name: str) -> int | None:
    """The run's task number in a task id this module gave, or None (not one of the run's)."""
    prefix = _TASK_ID.format(name=name, n="")
    return int(task_id[len(prefix) :]) if task_id.startswith(prefix) else None


class UserProducer:
    """Sends the user's tasks (the :class:`~effectq.testing.workers.Producer` interface)."""

    def __init__(self, config: WorkloadConfig, target: Target, sends: Sequence[Send]) -> None:
        self.config = config
        self.target = target
        self.sends = list(sends)
        self.base = random.randrange(10**6, 10**7) * 1000

    def send(self, task_no: int, effects: int = 0, *, countdown: float = 0.0, **_: Any) -> None:
        """Send task ``task_no``: the ``--send`` template ``task_no % len(sends)``, filled."""
        name, args, kwargs = self.sends[task_no % len(self.sends)].call(task_no, self.base + task_no)
        if self.target.kind == "celery":
            self.target.obj.send_task(
                name,
                args=args,
                kwargs=kwargs,
                task_id=_TASK_ID.format(name=self.config.name, n=task_no),
                queue=self.config.queue,
                countdown=countdown or None,
            )
            return
        actor = self.target.obj.get_actor(name)
        actor.send_with_options(args=args, kwargs=kwargs, delay=int(countdown * 1000) or None,
                                **{_OPTION: task_no})  # fmt: skip

    def queues(self) -> str:
        """The queue the workers consume: the run's own (Celery), or the actors' (Dramatiq)."""
        if self.target.kind == "celery":
            return self.config.queue
        names = {self.sends[i].call(i, 0)[0] for i in range(len(self.sends))}
        return ",".join(sorted({self.target.obj.get_actor(n).queue_name for n in names}))

    def close(self) -> None:
        """Nothing to close: the user's app keeps its connections."""

    def cleanup(self) -> None:
        """Delete the run's ledger and (Celery) its queue; never anything of the user's."""
        import redis

        from ..workers import _delete_rabbitmq, delete_keys

        config = self.config
        if self.target.kind == "celery":
            if self.target.broker == "rabbitmq":
                _delete_rabbitmq(str(self.target.obj.conf.broker_url), config.queue, dramatiq=False)
            else:
                client = redis.Redis.from_url(str(self.target.obj.conf.broker_url))
                client.delete(config.queue)
                client.close()
        client = redis.Redis.from_url(config.ledger, socket_connect_timeout=2)
        delete_keys(client, f"effectq-ledger:{{{config.name}}}*")
        client.close()


def _listen(ledger: Ledger) -> None:
    """Count every effect effectq ran to its return on the ledger, by effect key."""

    def on_event(event: effectq.events.Event) -> None:
        if event.kind is effectq.events.EventKind.EXECUTED:
            ledger.apply(f"{event.name} {event.key}")

    effectq.events.subscribe(on_event)


def _celery_notes(celery_app: Any, config: WorkloadConfig, ledger: Ledger) -> None:
    from celery import signals

    def prerun(task_id: str = "", task: Any = None, **_: Any) -> None:
        n = task_number(task_id, config.name)
        if n is not None:
            ledger.note("start", task=n, retries=int(getattr(task.request, "retries", 0) or 0))

    def postrun(task_id: str = "", state: str = "", **_: Any) -> None:
        n = task_number(task_id, config.name)
        if n is not None:
            ledger.note("stop", task=n)
            if state == "SUCCESS":
                ledger.note("done", task=n)

    signals.task_prerun.connect(prerun, weak=False)
    signals.task_postrun.connect(postrun, weak=False)


def _dramatiq_notes(dramatiq_broker: Any, ledger: Ledger) -> None:
    import dramatiq

    class Notes(dramatiq.Middleware):
        def before_process_message(self, broker: Any, message: Any) -> None:
            n = message.options.get(_OPTION)
            if n is not None:
                ledger.note("start", task=n, retries=int(message.options.get("retries", 0)))

        def after_process_message(
            self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
        ) -> None:
            n = message.options.get(_OPTION)
            if n is not None:
                ledger.note("stop", task=n)
                if exception is None:
                    ledger.note("done", task=n)

        after_skip_message = after_process_message

    dramatiq_broker.add_middleware(Notes())


app: Any = None
"""The user's Celery app, in a worker process of a Celery run."""
broker: Any = None
"""The user's Dramatiq broker, in a worker process of a Dramatiq run."""

if os.environ.get(APP_ENV):
    _config = WorkloadConfig.from_env()
    _ledger = Ledger.from_url(_config.ledger, _config.name)
    _target = load(os.environ[APP_ENV])
    _listen(_ledger)
    if _target.kind == "celery":
        app = _target.obj
        _celery_notes(app, _config, _ledger)
    else:
        import dramatiq as _dramatiq

        broker = _target.obj
        _dramatiq.set_broker(broker)
        _dramatiq_notes(broker, _ledger)
