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

if TYPE_CHECKING:
    from . import events
    from ._engine.calls import Applied
    from .context import EffectContext, KeyContext, current_effect
    from .effect import Effect, effect
    from .errors import (
        ClaimNotReplicatedError,
        CompletionNotReplicatedError,
        ConfigurationError,
        CorruptRecordError,
        EffectqError,
        InProgress,
        InputMismatchError,
        InvalidInputError,
        InvalidKeyError,
        NoActiveEffect,
        NoActiveRun,
        OutcomeUnknown,
        ReconcileError,
        ReentrantEffectError,
        ReplicationError,
        ResolveRefusedError,
        ResultDecodeError,
        ResultNotRecordedError,
        StoreError,
    )
    from .keys import effect_marker, find_markers, has_marker, idempotency_key
    from .options import MAYBE_APPLIED, OnMismatch, ReconcileOn
    from .runs import Run, RunStats, active_run, current_run, get_default_store, run, set_default_store
    from .steps import Step, StepDivergedError, step
    from .store import MemoryStore, Record, ResultState, Status, Store
    from .store.redis import RedisStore
    from .tools import ToolNotAllowed, ToolOptions, wrap_tools

__version__ = "0.1.0"

# Where each public name lives. They load on first use (PEP 562), so ``import effectq`` and the
# command line stay light: pydantic comes with the first effect, redis-py with the first RedisStore.
_SOURCES = {
    ".context": ("EffectContext", "KeyContext", "current_effect"),
    ".effect": ("Effect", "effect"),
    "._engine.calls": ("Applied",),
    ".errors": (
        "ClaimNotReplicatedError",
        "CompletionNotReplicatedError",
        "ConfigurationError",
        "CorruptRecordError",
        "EffectqError",
        "InProgress",
        "InputMismatchError",
        "InvalidInputError",
        "InvalidKeyError",
        "NoActiveEffect",
        "NoActiveRun",
        "OutcomeUnknown",
        "ReconcileError",
        "ReentrantEffectError",
        "ReplicationError",
        "ResolveRefusedError",
        "ResultDecodeError",
        "ResultNotRecordedError",
        "StoreError",
    ),
    ".keys": ("effect_marker", "find_markers", "has_marker", "idempotency_key"),
    ".options": ("MAYBE_APPLIED", "OnMismatch", "ReconcileOn"),
    ".runs": (
        "Run",
        "RunStats",
        "active_run",
        "current_run",
        "get_default_store",
        "run",
        "set_default_store",
    ),
    ".steps": ("Step", "StepDivergedError", "step"),
    ".store": ("MemoryStore", "Record", "ResultState", "Status", "Store"),
    ".store.redis": ("RedisStore",),
    ".tools": ("ToolNotAllowed", "ToolOptions", "wrap_tools"),
}
_HOME = {name: module for module, names in _SOURCES.items() for name in names}

__all__ = [
    "MAYBE_APPLIED",
    "Applied",
    "ClaimNotReplicatedError",
    "CompletionNotReplicatedError",
    "ConfigurationError",
    "CorruptRecordError",
    "Effect",
    "EffectContext",
    "EffectqError",
    "InProgress",
    "InputMismatchError",
    "InvalidInputError",
    "InvalidKeyError",
    "KeyContext",
    "MemoryStore",
    "NoActiveEffect",
    "NoActiveRun",
    "OnMismatch",
    "OutcomeUnknown",
    "ReconcileError",
    "ReconcileOn",
    "Record",
    "RedisStore",
    "ReentrantEffectError",
    "ReplicationError",
    "ResolveRefusedError",
    "ResultDecodeError",
    "ResultNotRecordedError",
    "ResultState",
    "Run",
    "RunStats",
    "Status",
    "Step",
    "StepDivergedError",
    "Store",
    "StoreError",
    "ToolNotAllowed",
    "ToolOptions",
    "active_run",
    "current_effect",
    "current_run",
    "effect",
    "effect_marker",
    "events",
    "find_markers",
    "get_default_store",
    "has_marker",
    "idempotency_key",
    "run",
    "set_default_store",
    "step",
    "wrap_tools",
]


if not TYPE_CHECKING:  # mypy reads the imports above, and flags a name that is not there

    def __getattr__(name: str) -> Any:
        if name == "events":
            return import_module(".events", __name__)
        module = _HOME.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(import_module(module, __name__), name)
        globals()[name] = value  # found once: later lookups skip this function
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


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
