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

from typing import TYPE_CHECKING, Any

from . import events
from .context import EffectContext, KeyContext, current_effect
from .effect import Effect, effect
from .engine import Applied
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
from .tools import ToolNotAllowed, ToolOptions, wrap_tools

if TYPE_CHECKING:
    from .store.redis import RedisStore

__version__ = "0.1.0"

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


def __getattr__(name: str) -> Any:
    if name == "RedisStore":
        from .store.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
