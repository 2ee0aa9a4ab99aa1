"""effectq: side effects that apply at most once per key, for Celery, Dramatiq and agents.

Wrap a side-effecting function with :func:`effect`, bind a run (a task, a
message, an agent run) with :func:`run` or a task-queue integration, and every
call applies at most once per effect key: across threads, processes, crashes
and redeliveries. The recorded result comes back on every later call; an
outcome nobody can know raises :class:`OutcomeUnknown` instead of repeating.

    import effectq

    store = effectq.RedisStore.from_url("redis://127.0.0.1:6379/0", namespace="shop")

    @effectq.effect(name="email.welcome")
    def send_welcome(to: str) -> str:
        return mailer.send(to, idempotency_key=effectq.current_effect().idempotency_key)

    with effectq.run("welcome-email:42", store=store):
        send_welcome("a@example.com")
"""

from __future__ import annotations

import sys
import types
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the type checker reads; the table below is what runs
    from . import events as events
    from ._engine.calls import Applied as Applied
    from .agents.steps import Step as Step
    from .agents.steps import step as step
    from .agents.tools import ToolOptions as ToolOptions
    from .agents.tools import wrap_tools as wrap_tools
    from .context import EffectContext as EffectContext
    from .context import KeyContext as KeyContext
    from .context import current_effect as current_effect
    from .effect import Effect as Effect
    from .effect import effect as effect
    from .errors import *  # noqa: F403
    from .keys import effect_marker as effect_marker
    from .keys import find_markers as find_markers
    from .keys import has_marker as has_marker
    from .keys import idempotency_key as idempotency_key
    from .options import MAYBE_APPLIED as MAYBE_APPLIED
    from .options import NOTHING as NOTHING
    from .options import OnMismatch as OnMismatch
    from .options import ReconcileOn as ReconcileOn
    from .outcome import Outcome as Outcome
    from .outcome import Streamed as Streamed
    from .runs import Run as Run
    from .runs import RunStats as RunStats
    from .runs import active_run as active_run
    from .runs import current_run as current_run
    from .runs import get_default_store as get_default_store
    from .runs import run as run
    from .runs import set_default_store as set_default_store
    from .store import MemoryStore as MemoryStore
    from .store import Record as Record
    from .store import ResultState as ResultState
    from .store import Status as Status
    from .store import Store as Store
    from .store.redis import RedisStore as RedisStore
    from .switch import EffectsDisabledWarning as EffectsDisabledWarning
    from .switch import disabled as disabled

__version__ = "0.1.0"

# Where each public name lives. They load on first use (PEP 562), so ``import effectq`` and the
# command line stay light: pydantic comes with the first effect, redis-py with the first RedisStore.
# The exceptions are those of ``effectq.errors.__all__``, found there on first use too.
_LAZY = {
    ".context": ("EffectContext", "KeyContext", "current_effect"),
    ".effect": ("Effect", "effect"),
    "._engine.calls": ("Applied",),
    ".keys": ("effect_marker", "find_markers", "has_marker", "idempotency_key"),
    ".options": ("MAYBE_APPLIED", "NOTHING", "OnMismatch", "ReconcileOn"),
    ".outcome": ("Outcome", "Streamed"),
    ".switch": ("EffectsDisabledWarning", "disabled"),
    ".runs": (
        "Run",
        "RunStats",
        "active_run",
        "current_run",
        "get_default_store",
        "run",
        "set_default_store",
    ),
    ".agents.steps": ("Step", "step"),
    ".store": ("MemoryStore", "Record", "ResultState", "Status", "Store"),
    ".store.redis": ("RedisStore",),
    ".agents.tools": ("ToolOptions", "wrap_tools"),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}


def _public() -> list[str]:
    """``__all__``: the names of the table and the exceptions (this loads ``effectq.errors``)."""
    return sorted([*import_module(".errors", __name__).__all__, *_HOME, "events"])


if not TYPE_CHECKING:  # mypy reads the imports above, and flags a name that is not there

    def __getattr__(name: str) -> Any:
        if name == "events":
            return import_module(".events", __name__)
        if name == "__all__":
            value = _public()
        elif name in _HOME:
            value = getattr(import_module(_HOME[name], __name__), name)
        else:
            errors = import_module(".errors", __name__)
            if name not in errors.__all__:
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
            value = getattr(errors, name)
        globals()[name] = value  # found once: later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_public()})


class _Package(types.ModuleType):
    """``effectq.effect`` is the decorator, also after the submodule of that name loads.

    Loading a submodule binds it on its package (``effectq.effect = <module effectq.effect>``);
    the decorator of the same name, found lazily, would lose to it.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "effect" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
