"""The exceptions effectq raises.

Every exception derives from :class:`EffectqError`. Failures end in ``Error``; expected outcomes (an
effect in flight elsewhere, an outcome nobody can know) are named for what happened. Each carries its
evidence as attributes, so a handler (or an operator reading a log line) does not have to parse
messages: ``key`` is the effect key, ``name`` the effect name and ``namespace`` the store's namespace
wherever they appear; each class's docstring names the others.

They travel: an exception's ``args`` are its constructor's arguments, so ``type(exc)(*exc.args)``
makes it again, which is how pickle (multiprocessing, Celery's prefork pool) and Celery's JSON result
backend rebuild exceptions. ``str(exc)`` is the message. Pickling keeps every attribute; JSON keeps
the plain ones (key, name, reason, ...) and leaves out a stored record, a claim or a result, which
arrive as ``None``.

The tree (``effectq.X`` for each; every name is also importable from here)::

    EffectqError
    ├── OutcomeUnknown                 nobody can know whether it applied
    ├── InProgress                     in flight elsewhere, still after the wait
    ├── ReentrantEffectError           an effect called inside itself
    ├── AttemptsExhausted              executed max_attempts times: the key is parked
    ├── RecordedFailure                a recorded terminal exception that cannot be raised as itself
    ├── StoreError                     the store failed or answered nonsense
    │   ├── CorruptRecordError
    │   └── ClaimNotReplicatedError    (also a ReplicationError)
    ├── ReplicationError               too few replicas acknowledged a write
    │   ├── ClaimNotReplicatedError
    │   └── CompletionNotReplicatedError
    ├── NoActiveRun
    ├── NoActiveEffect                 (also a LookupError)
    ├── InvalidInputError              (also a TypeError)
    ├── InvalidKeyError                (also a ValueError)
    ├── InputMismatchError             the key was recorded with another input
    │   └── StepDivergedError          a replayed step got another input
    ├── ResultNotRecordedError
    ├── ResultDecodeError
    ├── ReconcileError
    ├── ResolveRefusedError
    ├── ToolNotAllowed                 wrap_tools' ``allow`` said no
    ├── ConfigurationError             (also a ValueError)
    └── effectq.dramatiq.RunNotBoundError   (also Dramatiq's MiddlewareError)

``RunNotBoundError`` alone lives in :mod:`effectq.dramatiq`: it is a Dramatiq ``MiddlewareError``
too, and defining it here would load Dramatiq with ``import effectq``. What is not here is no error
of effectq's to catch: the command line's exit (``effectq.cli.session.CommandError``), the
``BaseException`` signals a driver or a test toolkit raises through user code and catches again
(``effect.StreamClosed``, ``testing.faults.Crash``), and the refusal of the test ledger, which
stands for a downstream system, not for effectq (``testing.ledger.Fenced``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .store.base import Claim, Record

__all__ = [
    "AttemptsExhausted",
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
    "RecordedFailure",
    "ReentrantEffectError",
    "ReplicationError",
    "ResolveRefusedError",
    "ResultDecodeError",
    "ResultNotRecordedError",
    "StepDivergedError",
    "StoreError",
    "ToolNotAllowed",
]


class EffectqError(Exception):
    """Base class of every exception effectq raises."""

    def _rebuilt_from(self, *args: Any) -> None:
        """Keep the message for ``str()``, and make ``args`` what rebuilds this exception:
        ``type(self)(*args)``. Each subclass with arguments of its own calls it last."""
        self.__dict__.setdefault("_message", Exception.__str__(self))
        self.args = args

    def __str__(self) -> str:
        message = self.__dict__.get("_message")
        return message if isinstance(message, str) else Exception.__str__(self)


class OutcomeUnknown(EffectqError):
    """Nobody can know whether the effect applied; it will not be replayed silently.

    The effect was dispatched and then its holder died, its lease ran out, or the function raised an
    exception that means "maybe applied" (a timeout, say). An operator settles it with
    ``effectq resolve KEY --applied`` or ``--not-applied``; a ``reconcile`` hook settles it automatically.

    Attributes:
        record: the stored record, when it was read.
        reason: why the outcome is unknown, as recorded.
    """

    def __init__(
        self,
        key: str,
        name: str = "",
        reason: str = "",
        record: Record | None = None,
        namespace: str = "",
    ) -> None:
        self.key = key
        self.name = name
        self.reason = reason
        self.record = record
        self.namespace = namespace
        ns = f" --namespace {namespace}" if namespace else ""
        super().__init__(
            f"effect {name or '?'} may have applied and will not be repeated "
            f"(key {key!r}; {reason or 'outcome unknown'}). Check the remote system, then "
            f"settle it with `effectq resolve{ns} '{key}' --applied` or `--not-applied`, "
            f"or give the effect a reconcile hook."
        )
        self._rebuilt_from(key, name, reason, None, namespace)


class InProgress(EffectqError):
    """The same effect is in flight elsewhere and did not finish within the wait.

    Attributes:
        waited: seconds this caller waited.
        owner: the holder of the claim (``host:pid:...``), when known.
    """

    def __init__(self, key: str, name: str = "", waited: float = 0.0, owner: str = "") -> None:
        self.key = key
        self.name = name
        self.waited = waited
        self.owner = owner
        holder = f" by {owner}" if owner else ""
        super().__init__(
            f"effect {name or '?'} is in flight{holder} (key {key!r}); waited {waited:.1f}s for its result"
        )
        self._rebuilt_from(key, name, waited, owner)


class ReentrantEffectError(EffectqError):
    """An effect was called, with the same key, from inside the call that holds that key.

    The inner call could only wait for the outer one, which waits for it; so it fails at once, before
    it claims anything or runs the function. Give the inner call a key of its own (other arguments,
    or a key function), or call the undecorated function (``.fn``).
    """

    def __init__(self, key: str, name: str = "") -> None:
        self.key = key
        self.name = name
        super().__init__(
            f"effect {name or '?'} was called with key {key!r} from inside its own call with that "
            f"key, and would wait for itself; this call ran nothing. Give it a key of its own, or "
            f"call the undecorated function (.fn)"
        )
        self._rebuilt_from(key, name)


def _resolve_hint(key: str, namespace: str) -> str:
    ns = f" --namespace {namespace}" if namespace else ""
    return f"`effectq resolve{ns} '{key}' --not-applied`"


class AttemptsExhausted(EffectqError):
    """The effect was executed ``max_attempts`` times under this key without completing: the key is
    parked as failed, and nothing runs until an operator resets it (or the retention ends).

    Each execution counts: one released after a "not applied" exception, a replay-safe or reconciled
    re-run of an unknown outcome, and one whose worker died in it. This stops a poison loop (a worker
    killed inside the same effect on every redelivery). ``effectq list --status failed`` lists parked
    keys; reset one with ``effectq resolve KEY --not-applied`` (its attempts start again from 0).

    Attributes:
        attempts: how many times the effect was executed under the key.
        last_error: the last execution's error, as recorded.
    """

    def __init__(
        self, key: str, name: str = "", attempts: int = 0, last_error: str = "", namespace: str = ""
    ) -> None:
        self.key = key
        self.name = name
        self.attempts = attempts
        self.last_error = last_error
        self.namespace = namespace
        super().__init__(
            f"effect {name or '?'} was executed {attempts} times under key {key!r} without completing "
            f"and is parked as failed (last error: {last_error or 'none recorded'}); nothing was run. "
            f"Fix the cause, then reset it with {_resolve_hint(key, namespace)}."
        )
        self._rebuilt_from(key, name, attempts, last_error, namespace)


class RecordedFailure(EffectqError):
    """An earlier attempt raised an exception the effect declares terminal; it was recorded, and this
    call did not run the function.

    Raised in its place when the recorded exception cannot be raised again as its own type (the type
    no longer imports, or ``type(*args)`` does not rebuild it with the same message); the rebuilt
    exception, when there is one, has this as its ``__cause__``.

    Attributes:
        type_name: the recorded exception's qualified class name.
        message: its message (``str(exc)``).
        args_json: its arguments as recorded (JSON text; ``"null"`` when they were not JSON).
        detail: why it is raised in the exception's place (``""`` when it is only the cause).
    """

    def __init__(
        self,
        key: str,
        name: str = "",
        type_name: str = "",
        message: str = "",
        args_json: str = "null",
        detail: str = "",
        namespace: str = "",
    ) -> None:
        self.key = key
        self.name = name
        self.type_name = type_name
        self.message = message
        self.args_json = args_json
        self.detail = detail
        self.namespace = namespace
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"effect {name or '?'} failed terminally under key {key!r} with {type_name}: {message}{why}; "
            f"recorded, it is raised again without running until the retention ends or "
            f"{_resolve_hint(key, namespace)}"
        )
        self._rebuilt_from(key, name, type_name, message, args_json, detail, namespace)


class StoreError(EffectqError):
    """The store failed or could not be reached. Not claimed means not run.

    ``sent``: whether the request may have reached the store. False only when nothing of it was
    sent (a connection refused at connect, say): it cannot have been carried out.
    """

    sent: bool = True


class CorruptRecordError(StoreError):
    """A stored record is not one effectq wrote (wrong type or unknown status); ``detail``: what was found."""

    def __init__(self, key: str, detail: str) -> None:
        self.key = key
        self.detail = detail
        super().__init__(
            f"the record for key {key!r} is corrupt ({detail}); nothing was run. "
            f"Inspect it with `effectq show '{key}'` before deleting it."
        )
        self._rebuilt_from(key, detail)


class ReplicationError(EffectqError):
    """Fewer replicas than asked for acknowledged a write (``RedisStore(wait_replicas=N)``).

    The write reached the primary; a failover before it reaches a replica would lose it. Catch this
    class for both cases below.

    Attributes:
        acknowledged: how many replicas acknowledged the write within the timeout.
        required: how many the store asks for.
    """

    def __init__(self, key: str, message: str, acknowledged: int, required: int) -> None:
        self.key = key
        self.acknowledged = acknowledged
        self.required = required
        super().__init__(f"{message} ({acknowledged} of {required} replicas acknowledged; key {key!r})")
        self._rebuilt_from(key, message, acknowledged, required)


class ClaimNotReplicatedError(ReplicationError, StoreError):
    """Too few replicas acknowledged the claim: the effect did not run.

    A failover could lose the claim and let another caller run the effect at the same time, so the
    function was not called; the claim granted on the primary (``claim``; its ``token`` fences it) is
    given back. Like any :class:`StoreError`, it is safe to retry the call.
    """

    def __init__(self, key: str, claim: Claim, acknowledged: int, required: int) -> None:
        self.claim = claim
        super().__init__(
            key,
            "effectq did not run the effect: too few replicas acknowledged its claim",
            acknowledged=acknowledged,
            required=required,
        )
        self._rebuilt_from(key, None, acknowledged, required)


class CompletionNotReplicatedError(ReplicationError):
    """The effect applied, but too few replicas acknowledged its record.

    Not a :class:`StoreError`: the effect DID apply, and ``result`` holds what it returned. The record
    is on the primary. If the primary fails over before a replica has it, the promoted replica still
    holds the claim (which was replicated, or the effect would not have run): the next call waits for
    its lease, then gets :class:`OutcomeUnknown`, not a silent repeat.

    Attributes:
        name: the effect name (set when raised by an effect call).
        result: what the function returned (set when raised by an effect call).
    """

    def __init__(
        self, key: str, acknowledged: int, required: int, name: str = "", result: Any = None
    ) -> None:
        self.name = name
        self.result = result
        what = f"effect {name}" if name else "the effect"
        super().__init__(
            key,
            f"{what} applied, but its record may be lost on failover: too few replicas acknowledged it",
            acknowledged=acknowledged,
            required=required,
        )
        self._rebuilt_from(key, acknowledged, required, name, None)


class NoActiveRun(EffectqError):
    """An effect was called outside ``effectq.run(...)`` (or a task integration)."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        what = f"effect {name}" if name else "an effect"
        super().__init__(
            f"{what} was called with no run bound; wrap the call in "
            f"`with effectq.run(run_id, store=store):` or install the Celery/Dramatiq integration. "
            f"Nothing was run."
        )
        self._rebuilt_from(name)


class NoActiveEffect(EffectqError, LookupError):
    """``current_effect()`` was called outside an effect."""


class InvalidInputError(EffectqError, TypeError):
    """An effect's input cannot be canonicalised into a key; ``argument``: the argument (and the path
    inside it) that could not be canonicalised."""

    def __init__(self, message: str, argument: str = "") -> None:
        self.argument = argument
        super().__init__(message)
        self._rebuilt_from(message, argument)


class InvalidKeyError(EffectqError, ValueError):
    """A key function returned something that cannot be an effect key."""


class InputMismatchError(EffectqError):
    """The key was recorded with a different input (raised when ``on_mismatch="raise"``).

    Attributes:
        recorded_hash: hash of the recorded input.
        input_hash: hash of this call's input.
    """

    def __init__(self, key: str, name: str, recorded_hash: str, input_hash: str) -> None:
        self.key = key
        self.name = name
        self.recorded_hash = recorded_hash
        self.input_hash = input_hash
        super().__init__(
            f"effect {name} key {key!r} was recorded with a different input "
            f"(recorded {recorded_hash[:12]}, now {input_hash[:12]}); not run again"
        )
        self._rebuilt_from(key, name, recorded_hash, input_hash)


class StepDivergedError(InputMismatchError):
    """A replayed step was called with an input other than the journaled one.

    Raised instead of returning the journaled value when the step has ``on_mismatch="raise"``.
    Nothing was run. Its ``key`` is the step's journal key, its ``name`` the step name.

    Attributes:
        ordinal: which call of the step diverged (0 for the first).
        run_id: the run id.
        recorded_hash: hash of the journaled input.
        input_hash: hash of this call's input.
    """

    def __init__(
        self, key: str, name: str, ordinal: int, run_id: str, recorded_hash: str, input_hash: str
    ) -> None:
        super().__init__(key, name=name, recorded_hash=recorded_hash, input_hash=input_hash)
        self.ordinal = ordinal
        self.run_id = run_id
        self._message = (
            f"step {name} #{ordinal} of run {run_id!r} diverged: it was journaled with another input "
            f"(journaled {recorded_hash[:12]}, now {input_hash[:12]}), so this run no longer makes the "
            f"same calls as the attempt that journaled it. Nothing was run. Look for what changed "
            f"between attempts (the code, or a value read outside a step); to start over, use a new run id."
        )
        self._rebuilt_from(key, name, ordinal, run_id, recorded_hash, input_hash)


class ResultNotRecordedError(EffectqError):
    """The effect applied, but its result was not recorded, so it cannot be replayed; ``reason``: why
    (too large, not serialisable)."""

    def __init__(self, key: str, name: str, reason: str) -> None:
        self.key = key
        self.name = name
        self.reason = reason
        super().__init__(
            f"effect {name} already applied (key {key!r}) but its result was not recorded "
            f"({reason}); it will not run again"
        )
        self._rebuilt_from(key, name, reason)


class ResultDecodeError(EffectqError):
    """A recorded result no longer fits the effect's return type; ``detail``: how it does not."""

    def __init__(self, key: str, name: str, detail: str) -> None:
        self.key = key
        self.name = name
        self.detail = detail
        super().__init__(
            f"effect {name} already applied (key {key!r}) but its recorded result does not "
            f"validate as the return type any more: {detail}"
        )
        self._rebuilt_from(key, name, detail)


class ReconcileError(EffectqError):
    """A reconcile hook raised before a first execution; nothing was run."""

    def __init__(self, key: str, name: str) -> None:
        self.key = key
        self.name = name
        super().__init__(f"reconcile of effect {name} (key {key!r}) raised; nothing was run")
        self._rebuilt_from(key, name)


class ResolveRefusedError(EffectqError):
    """An operator's resolve did not apply: the record is not in doubt (or is gone); ``status``: the
    status found (``None`` when there is no record)."""

    def __init__(self, key: str, status: str | None, detail: str = "") -> None:
        self.key = key
        self.status = status
        found = "no record" if status is None else f"status {status}"
        self.detail = detail
        super().__init__(f"refused to resolve {key!r}: {found}{'; ' + detail if detail else ''}")
        self._rebuilt_from(key, status, detail)


class ToolNotAllowed(EffectqError):
    """The ``allow`` check of :func:`wrap_tools` refused a call of the tool ``tool``; nothing ran."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        super().__init__(
            f"tool {tool!r} is not allowed in this run (allow({tool!r}) said no); nothing was run"
        )
        self._rebuilt_from(tool)


class ConfigurationError(EffectqError, ValueError):
    """An option has a value effectq cannot work with."""
