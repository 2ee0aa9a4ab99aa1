"""Options of an effect, normalised once at decoration time."""

from __future__ import annotations

import enum
import inspect
import itertools
import math
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any

from ._exceptions import exception_chain
from .errors import ConfigurationError

__all__ = [
    "FROM_ANNOTATION",
    "MAX_ATTEMPTS_LIMIT",
    "MAYBE_APPLIED",
    "NOTHING",
    "Duration",
    "EffectOptions",
    "OnMismatch",
    "ReconcileOn",
    "Redaction",
    "classifier",
    "raised_by_signal_handler",
    "seconds",
    "terminal_classifier",
]

Duration = float | int | timedelta
"""Seconds, or a ``timedelta``."""


class ReconcileOn(enum.StrEnum):
    """When a ``reconcile`` hook is asked whether the effect already applied."""

    UNKNOWN = "unknown"
    """Only when the outcome of an earlier attempt is unknown (the default)."""
    ALWAYS = "always"
    """Also before every first execution (read-before-write), at one extra round trip."""


class OnMismatch(enum.StrEnum):
    """What to do when a key was recorded with a different input (key functions only)."""

    WARN = "warn"
    """Return the recorded result and log a warning (the default)."""
    RAISE = "raise"
    """Raise :class:`~effectq.errors.InputMismatchError`."""


MAYBE_APPLIED: tuple[str, ...] = (
    "builtins.TimeoutError",
    "builtins.ConnectionResetError",
    "builtins.ConnectionAbortedError",
    "builtins.BrokenPipeError",
    "billiard.exceptions.SoftTimeLimitExceeded",
    "billiard.exceptions.TimeLimitExceeded",
    "dramatiq.threading.Interrupt",
    "requests.exceptions.ReadTimeout",
    "requests.exceptions.ChunkedEncodingError",
    "urllib3.exceptions.ReadTimeoutError",
    "urllib3.exceptions.ProtocolError",
    "httpx.ReadTimeout",
    "httpx.WriteTimeout",
    "httpx.RemoteProtocolError",
    "aiohttp.client_exceptions.ServerTimeoutError",
    "aiohttp.client_exceptions.ServerDisconnectedError",
    "redis.exceptions.TimeoutError",
    "redis.exceptions.ConnectionError: Connection closed by server.",
)
"""Exceptions that mean "maybe applied", by qualified class name (subclasses match); a name
followed by ``": "`` and a message matches only an exception of that class whose ``str()`` is that
message, for a client that tells a lost reply from a failed connect by its message alone: redis-py
raises its ``ConnectionError("Connection closed by server.")``, over no other exception, when the
server or a proxy closed the connection (cleanly, not by a reset) after the request went out, as
aiohttp's ``ServerDisconnectedError`` and httpx's ``RemoteProtocolError`` say of an HTTP reply.

So does an exception raised from one of them, or while handling one (its ``__cause__``, else its
``__context__``, as a traceback shows them): a client library's own error over a reset or a
timeout (redis-py's ``ConnectionError`` over a ``ConnectionResetError``, requests' over urllib3's)
means what the error it wraps means; ``raise ... from None`` says the new exception alone counts.
Any other ``Exception`` means "not applied": the record is released and the next call applies
the effect (redis-py's ``ConnectionError`` over a refused connection, for one). A
``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
``asyncio.CancelledError``, Dramatiq's ``TimeLimitExceeded`` and ``Shutdown``) also means
"maybe applied", and so does any exception a signal handler raised (see
:func:`raised_by_signal_handler`). Celery's ``SoftTimeLimitExceeded`` is billiard's. Names are
matched without importing the libraries.
"""


TIME_LIMITS: frozenset[str] = frozenset(
    {"billiard.exceptions.SoftTimeLimitExceeded", "billiard.exceptions.TimeLimitExceeded"}
)
"""Exceptions a worker's time limit raises from a signal handler wherever the task is, by
qualified class name. One that cuts a store call short is the task's to handle: the store
reports it as it is, not as a store failure to retry. (Dramatiq's time limit raises a
``BaseException``, never taken for a store failure.)"""


def is_time_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :data:`TIME_LIMITS` (or a subclass)."""
    return any(_qualname(cls) in TIME_LIMITS for cls in type(exc).__mro__)


class Redaction(enum.Enum):
    """What of a result is recorded besides what a ``redact`` function keeps."""

    NOTHING = "nothing"
    """Record "applied" and no result at all: a replay returns ``None``."""


NOTHING = Redaction.NOTHING
"""``redact=effectq.NOTHING``: record that the effect applied, without its result."""

Redact = Callable[[Any], Any] | Redaction | None
"""A ``redact`` option: a function of the result, :data:`NOTHING`, or None (record it as it is)."""


def redaction(value: Any) -> Redact:
    """Check a ``redact`` option."""
    if value is None or value is NOTHING or (callable(value) and not isinstance(value, type)):
        return value
    raise ConfigurationError(
        f"redact must be a function of the result (returning what to record) or effectq.NOTHING, "
        f"not {value!r}"
    )


class _FromAnnotation:
    """The recorded type is the function's return annotation."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "FROM_ANNOTATION"


FROM_ANNOTATION: Any = _FromAnnotation()


def seconds(value: Duration, *, option: str, allow_zero: bool = False) -> float:
    """Normalise a duration option to seconds, refusing nonsense with a clear error."""
    if isinstance(value, timedelta):
        result = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        result = float(value)
    else:
        raise ConfigurationError(f"{option} must be seconds or a timedelta, not {value!r}")
    if math.isnan(result) or math.isinf(result) or result < 0 or (result == 0 and not allow_zero):
        raise ConfigurationError(f"{option} must be a positive duration, not {value!r}")
    return result


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def raised_by_signal_handler(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from, or while handling) came out of a
    Python signal handler: raised into whatever the interrupted code was doing, so it says
    nothing about how far that code got.

    Celery's cold shutdown of a solo worker is one: its SIGQUIT handler cancels the running
    task, and the solo pool, which cannot kill a job, raises ``NotImplementedError`` from
    the handler into the task. A handler is recognised by how Python calls it, whether or
    not it is still installed: a frame of the traceback whose positional arguments hold a
    signal number followed by the very frame it interrupted (the frame that called it).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        tb = current.__traceback__
        while tb is not None:
            if _called_as_signal_handler(tb.tb_frame):
                return True
            tb = tb.tb_next
        current = current.__cause__ or current.__context__
    return False


def _called_as_signal_handler(frame: FrameType) -> bool:
    """Whether Python called ``frame``'s function as a signal handler: ``(signum, frame)``,
    where that frame is the caller (a bound method or ``functools.partial`` puts its own
    arguments first, ``*args`` takes them as a tuple)."""
    interrupted, code = frame.f_back, frame.f_code
    varargs = bool(code.co_flags & inspect.CO_VARARGS)
    if interrupted is None or (code.co_argcount < 2 and not varargs):
        return False
    names, values = code.co_varnames, frame.f_locals
    positional = [values.get(name) for name in names[: code.co_argcount]]
    if varargs:
        extra = values.get(names[code.co_argcount + code.co_kwonlyargcount])
        positional.extend(extra if isinstance(extra, tuple) else ())
    return any(
        given is interrupted and type(number) is int and 0 < number < signal.NSIG
        for number, given in itertools.pairwise(positional)
    )


MAX_ATTEMPTS_LIMIT = 10
"""The highest ``max_attempts`` an effect may declare: past it, a loop is no longer a retry."""


def attempts(value: Any) -> int:
    """Normalise ``max_attempts``: a whole number from 1 to :data:`MAX_ATTEMPTS_LIMIT`."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ConfigurationError(
            f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS_LIMIT} (executions of one "
            f"key before it is parked as failed), not {value!r}"
        )
    return value


def _matcher(spec: Iterable[Any] | type | str, option: str) -> Callable[[BaseException], bool]:
    """Whether an exception is one of ``spec``'s classes or qualified names (subclasses match), or
    of a ``"name: message"`` class with that message."""
    if isinstance(spec, str | type):
        spec = (spec,)  # one class or name, as a one-item list
    names: set[str] = set()
    messages: dict[str, set[str]] = {}
    types: list[type[BaseException]] = []
    for item in spec:
        if isinstance(item, str) and ": " in item:
            name, message = item.split(": ", 1)
            messages.setdefault(name, set()).add(message)
        elif isinstance(item, str):
            names.add(item)
        elif isinstance(item, type) and issubclass(item, BaseException):
            types.append(item)
        else:
            raise ConfigurationError(f"{option} takes exception classes or qualified names, not {item!r}")
    frozen_types = tuple(types)

    def matches(exc: BaseException) -> bool:
        if frozen_types and isinstance(exc, frozen_types):
            return True
        if names and any(_qualname(cls) in names for cls in type(exc).__mro__):
            return True
        if not messages:
            return False
        return any(str(exc) in messages.get(_qualname(cls), ()) for cls in type(exc).__mro__)

    return matches


def terminal_classifier(
    spec: Iterable[type[BaseException] | str] | type[BaseException] | str | None,
) -> Callable[[BaseException], bool] | None:
    """Build the "terminal?" test from classes or qualified names (None: no exception is).

    Only an ``Exception`` can be terminal, and never one a signal handler raised: those say
    nothing about how far the function got (see :func:`raised_by_signal_handler`).
    """
    if spec is None:
        return None
    if callable(spec) and not isinstance(spec, type):
        raise ConfigurationError(f"terminal takes exception classes or qualified names, not {spec!r}")
    matches = _matcher(spec, "terminal")

    def terminal(exc: BaseException) -> bool:
        return isinstance(exc, Exception) and matches(exc) and not raised_by_signal_handler(exc)

    return terminal


def classifier(
    spec: Iterable[type[BaseException] | str] | Callable[[BaseException], bool] | None,
) -> Callable[[BaseException], bool]:
    """Build the "maybe applied?" test from types, qualified names, or a callable.

    Types and names add to the two rules that always hold: a ``BaseException`` that is
    not an ``Exception``, and an exception a signal handler raised, mean "maybe applied".
    Each is asked of the exception and of those it was raised from or while handling (see
    :data:`MAYBE_APPLIED`). A callable decides alone (it may ask :func:`raised_by_signal_handler`).
    """
    if spec is None:
        spec = MAYBE_APPLIED
    if callable(spec) and not isinstance(spec, type):
        return spec
    matches = _matcher(spec, "maybe_applied")

    def maybe_applied(exc: BaseException) -> bool:
        if not isinstance(exc, Exception) or raised_by_signal_handler(exc):
            return True
        return any(not isinstance(link, Exception) or matches(link) for link in exception_chain(exc))

    return maybe_applied


@dataclass(frozen=True, slots=True)
class EffectOptions:
    """The options of one effect, in seconds and enums (see :func:`effectq.effect`)."""

    name: str
    key: Callable[[dict[str, Any], Any], str] | None = None
    key_args: tuple[str, ...] | None = None
    reconcile: Callable[..., Any] | None = None
    reconcile_on: ReconcileOn = ReconcileOn.UNKNOWN
    lease: float = 60.0
    wait: float = 30.0
    retention: float = 7 * 24 * 3600.0
    replay_safe: bool = False
    on_mismatch: OnMismatch = OnMismatch.WARN
    maybe_applied: Callable[[BaseException], bool] = field(default_factory=lambda: classifier(None))
    terminal: Callable[[BaseException], bool] | None = None
    """Whether an exception is terminal (recorded and raised again on every later call); None: none is."""
    max_attempts: int = 3
    """Executions of one key (1 to :data:`MAX_ATTEMPTS_LIMIT`) before it is parked as failed."""
    max_result_bytes: int = 64 * 1024
    result_type: Any = FROM_ANNOTATION
    redact: Redact = None
    lease_ms: int = field(init=False, repr=False, compare=False)
    """The lease in milliseconds, as the store takes it (computed once: every call sends it)."""
    retention_ms: int = field(init=False, repr=False, compare=False)
    """The retention in milliseconds."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lease_ms", max(1, int(self.lease * 1000)))
        object.__setattr__(self, "retention_ms", max(1, int(self.retention * 1000)))
