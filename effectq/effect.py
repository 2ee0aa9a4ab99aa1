"""The ``@effectq.effect`` decorator.

Bare or with keyword options (like tenacity's ``retry``), typed with
``ParamSpec`` so the wrapped function keeps its signature for mypy and IDEs.
Everything that can be wrong with a call (no run bound, arguments that do not
bind, input that cannot be keyed, a bad key) raises before anything is claimed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar, overload

from . import switch
from ._engine.calls import Call, new_owner
from ._engine.drive import StreamClosed, run_async, run_sync
from ._runtime.singleflight import flights, follow, follow_async
from .canonical import key_bytes
from .codec import ResultCodec, result_annotation
from .context import EffectContext, KeyContext, bind_effect, unbind_effect
from .errors import (
    ConfigurationError,
    InvalidInputError,
    NoActiveRun,
)
from .keys import (
    bridge_hash,
    bridge_key,
    check_key,
    check_name,
    default_key,
    default_name,
    key_params,
    legacy_keys,
    sha256,
)
from .options import (
    FROM_ANNOTATION,
    EffectOptions,
    OnMismatch,
    ReconcileOn,
    Redact,
    attempts,
    classifier,
    redaction,
    seconds,
    terminal_classifier,
)
from .outcome import Seen, waited
from .outcome_calls import OutcomeCalls
from .runs import _current as _bound_run
from .store.base import ClaimRequest
from .streams import StreamCalls

__all__ = ["Effect", "effect"]

P = ParamSpec("P")
R = TypeVar("R")

KeyFunction = Callable[[dict[str, Any], KeyContext], str]
ReconcileHook = Callable[[str, dict[str, Any], EffectContext], Any]


class Effect(StreamCalls, OutcomeCalls[P, R]):
    """A side-effecting function that applies at most once per effect key.

    Calling it inside a run claims the key, then executes, replays the recorded
    result, waits for the same effect in flight elsewhere, reconciles, or raises
    :class:`~effectq.errors.OutcomeUnknown`. See :func:`effect` for the options.
    """

    def __init__(self, fn: Callable[P, R], options: EffectOptions) -> None:
        self.fn: Callable[P, R] = fn
        if inspect.iscoroutinefunction(fn):
            self._invoke_kind = "async"
        elif inspect.isasyncgenfunction(fn):
            self._invoke_kind = "async_gen"
        elif inspect.isgeneratorfunction(fn):
            self._invoke_kind = "gen"
        else:
            self._invoke_kind = "sync"
        if self._invoke_kind in ("gen", "async_gen"):
            # A consumer's early close is no exception of the function's: whatever maybe_applied
            # says of those, the stream may have partly applied (see StreamClosed).
            options = dataclasses.replace(options, maybe_applied=_or_closed(options.maybe_applied))
        self.options = options
        self.name = options.name
        self._signature = inspect.signature(fn)
        self._codec: ResultCodec | None = None
        self._codec_lock = threading.Lock()
        self._key_params = key_params(self._signature, options.key_args, options.name, fn)
        params = list(self._signature.parameters.values())
        plain = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
        self._names = tuple(p.name for p in params) if plain else None  # binds by zip, fast
        self._all_keyed = set(self._key_params) == {p.name for p in params}
        # What every claim of this effect asks, the same for each: worked out once, not per call.
        self._can_reconcile = options.reconcile is not None
        self._reconcile_first = self._can_reconcile and options.reconcile_on is ReconcileOn.ALWAYS
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<effect {self.name}>"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)

    @property
    def codec(self) -> ResultCodec:
        """The result codec, built from the return annotation on first use."""
        codec = self._codec
        if codec is None:
            with self._codec_lock:
                if self._codec is None:
                    annotation = self.options.result_type
                    if annotation is FROM_ANNOTATION:
                        annotation = result_annotation(self.fn, name=self.name)
                    self._codec = ResultCodec(annotation, name=self.name, redact=self.options.redact)
                codec = self._codec
        return codec

    def key(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """The effect key a call with these arguments would use in the bound run.

        Note that this counts as a call for ``ctx.ordinal``.
        """
        return self._prepare(args, kwargs).key

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if switch.on:
            return switch.call_plain(self, args, kwargs)  # type: ignore[no-any-return]
        call = self._prepare(args, kwargs)
        kind = self._invoke_kind
        if kind == "sync":
            return self._call_sync(call, args, kwargs)  # type: ignore[no-any-return]
        if kind == "async":
            return self._call_async(call, args, kwargs)  # type: ignore[return-value]
        if kind == "gen":
            return self._stream(call, args, kwargs)  # type: ignore[return-value]
        return self._stream_async(call, args, kwargs)  # type: ignore[return-value]

    # -- preparing a call (everything that can fail before a claim) ------------------------

    def _prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
        bound_run = _bound_run.get()  # active_run(), without its call
        if bound_run is None:
            raise NoActiveRun(self.name)
        names = self._names
        if names is not None and not kwargs and len(args) == len(names):
            arguments = dict(zip(names, args, strict=True))
        else:
            bound = self._signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = dict(bound.arguments)
        options = self.options
        if self._codec is None:
            self.codec  # noqa: B018 - an unrecordable return type fails here, before a claim
        ordinal, seq = bound_run.next_ordinal(self.name)
        store = bound_run.store
        if options.key is None:
            data, other = key_bytes(self._keyed(arguments), legacy=legacy_keys())
            input_hash = sha256(data).hexdigest()
            key = default_key(bound_run.id, self.name, input_hash)
            if other is not None:  # the other key scheme's key differs: a record there is this call's
                key = bridge_key(store, key, default_key(bound_run.id, self.name, sha256(other).hexdigest()))
        else:
            ctx = KeyContext(run_id=bound_run.id, name=self.name, ordinal=ordinal, seq=seq, run=bound_run)
            key = check_key(options.key(arguments, ctx), name=self.name)
            try:  # 128 bits are plenty to tell two inputs of one key apart
                data, other = key_bytes(self._keyed(arguments), legacy=legacy_keys())
                input_hash = sha256(data).hexdigest()[:32]
                if other is not None:
                    input_hash = bridge_hash(store, key, input_hash, sha256(other).hexdigest()[:32])
            except InvalidInputError:
                input_hash = ""  # the key function is the identity; no mismatch check
        # Positional, in ClaimRequest's field order: a class called with keywords builds a
        # dict of them first, which costs more than the rest of building it.
        request = ClaimRequest(
            options.lease_ms,  # lease_ms
            new_owner(),  # owner
            self.name,  # name
            bound_run.id,  # run_id
            input_hash if options.key is not None else "",  # input_hash
            self._can_reconcile,  # can_reconcile
            options.replay_safe,  # replay_safe
            self._reconcile_first,  # reconcile_first
            options.retention_ms,  # retention_ms
            not bound_run.prefetch_tried,  # prefetch
            options.max_attempts,  # max_attempts
        )
        return Call(self, bound_run, store, key, request.input_hash, arguments, ordinal, request)

    def _keyed(self, arguments: dict[str, Any]) -> dict[str, Any]:
        if self._all_keyed:
            return arguments
        params = self._key_params
        return {name: value for name, value in arguments.items() if name in params}

    # -- the four ways to run ------------------------------------------------------------

    def _call_sync(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen = None) -> Any:
        me = threading.get_ident()
        flight, leader = flights.join(call.store, call.key, call.input_hash, me)
        if not leader:
            flight = follow(flight, call, me)
            if flight.done:
                return waited(flight.outcome(), seen)
        try:
            value, came = run_sync(call, functools.partial(self._invoke_sync, args, kwargs))
        except BaseException as exc:
            flights.land(flight, error=exc)
            raise
        flights.land(flight, value)
        if seen is not None:
            seen.append((value, came))
        return value

    def _invoke_sync(self, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: EffectContext) -> Any:
        token = bind_effect(ctx)
        try:
            return self.fn(*args, **kwargs)
        finally:
            unbind_effect(token)

    async def _call_async(
        self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], seen: Seen = None
    ) -> Any:
        me = asyncio.current_task()
        flight, leader = flights.join(call.store, call.key, call.input_hash, me)
        if not leader:
            flight = await follow_async(flight, call, me)
            if flight.done:
                return waited(flight.outcome(), seen)
        try:
            value, came = await run_async(call, functools.partial(self._invoke_async, args, kwargs))
        except BaseException as exc:
            flights.land(flight, error=exc)
            raise
        flights.land(flight, value)
        if seen is not None:
            seen.append((value, came))
        return value

    async def _invoke_async(self, args: tuple[Any, ...], kwargs: dict[str, Any], ctx: EffectContext) -> Any:
        token = bind_effect(ctx)
        try:
            return await self.fn(*args, **kwargs)  # type: ignore[misc]
        finally:
            unbind_effect(token)


def _or_closed(maybe_applied: Callable[[BaseException], bool]) -> Callable[[BaseException], bool]:
    def classify(exc: BaseException) -> bool:
        return isinstance(exc, StreamClosed) or maybe_applied(exc)

    return classify


@overload
def effect(fn: Callable[P, R], /) -> Effect[P, R]: ...


@overload
def effect(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    key: KeyFunction | None = None,
    key_args: Iterable[str] | None = None,
    reconcile: ReconcileHook | None = None,
    reconcile_on: ReconcileOn | str = ReconcileOn.UNKNOWN,
    lease: float | timedelta = 60.0,
    wait: float | timedelta = 30.0,
    retention: float | timedelta = timedelta(days=7),
    replay_safe: bool = False,
    on_mismatch: OnMismatch | str = OnMismatch.WARN,
    maybe_applied: Iterable[type[BaseException] | str] | Callable[[BaseException], bool] | None = None,
    terminal: Iterable[type[BaseException] | str] | type[BaseException] | str | None = None,
    max_attempts: int = 3,
    max_result_bytes: int = 64 * 1024,
    result_type: Any = FROM_ANNOTATION,
    redact: Redact = None,
) -> Callable[[Callable[P, R]], Effect[P, R]]: ...


def effect(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    key: KeyFunction | None = None,
    key_args: Iterable[str] | None = None,
    reconcile: ReconcileHook | None = None,
    reconcile_on: ReconcileOn | str = ReconcileOn.UNKNOWN,
    lease: float | timedelta = 60.0,
    wait: float | timedelta = 30.0,
    retention: float | timedelta = timedelta(days=7),
    replay_safe: bool = False,
    on_mismatch: OnMismatch | str = OnMismatch.WARN,
    maybe_applied: Iterable[type[BaseException] | str] | Callable[[BaseException], bool] | None = None,
    terminal: Iterable[type[BaseException] | str] | type[BaseException] | str | None = None,
    max_attempts: int = 3,
    max_result_bytes: int = 64 * 1024,
    result_type: Any = FROM_ANNOTATION,
    redact: Redact = None,
) -> Effect[P, R] | Callable[[Callable[P, R]], Effect[P, R]]:
    """Make a side-effecting function apply at most once per effect key.

    Args:
        name: a stable name, part of the key; defaults to ``module.qualname``. Name
            effects explicitly so keys survive a refactor.
        key: ``key(args, ctx) -> str``: the effect key, from the bound arguments by
            name and a :class:`~effectq.KeyContext` (run id, ordinal). Defaults to
            ``run id:name:sha256(canonical JSON of the arguments)``.
        key_args: only these arguments form the default key (the rest, say a client
            object, are left out). By default every argument but ``self``/``cls``.
        reconcile: ``reconcile(key, args, ctx)`` asks the remote system whether an
            earlier attempt applied: return the found result, or ``None`` for "not
            applied" (``effectq.Applied(value)`` when the result is ``None``).
        reconcile_on: ``"unknown"`` (only after an unknown outcome) or ``"always"``
            (also before every first execution).
        lease: how long a silent holder keeps the claim; renewed while the function runs.
        wait: how long a caller waits for the same effect in flight elsewhere before
            :class:`~effectq.errors.InProgress`.
        retention: how long a completed result is kept.
        replay_safe: the remote side dedupes by ``current_effect().idempotency_key``,
            so an unknown outcome may be re-executed with the same key.
        on_mismatch: ``"warn"`` or ``"raise"`` when a key (from a key function) was
            recorded with a different input.
        maybe_applied: exceptions meaning "maybe applied" (classes or qualified
            names, or a predicate); default :data:`effectq.options.MAYBE_APPLIED`.
        terminal: exceptions that end the effect for good (classes or qualified names):
            one raised by the function is recorded, and every later call with the key
            raises it again without running (until the retention ends or an operator
            resolves the key). Checked before ``maybe_applied``.
        max_attempts: executions of one key (1 to 10) before it is parked as failed
            (:class:`~effectq.errors.AttemptsExhausted`); each release, re-run of an
            unknown outcome, and worker that died in it counts.
        max_result_bytes: a result larger than this (as JSON) is recorded as applied
            without its result.
        result_type: the type results are recorded and replayed as; defaults to the
            return annotation.
        redact: ``redact(result)`` is what is recorded (drop a card number, a token):
            this call returns the result itself, a replay the redacted one, which must
            be of the return type. ``effectq.NOTHING`` records "applied" without a result:
            a replay returns ``None``. See docs/operations.md for what Redis keeps.
    """
    options = EffectOptions(
        name="",
        key=key,
        key_args=None if key_args is None else tuple(key_args),
        reconcile=reconcile,
        reconcile_on=_enum(ReconcileOn, reconcile_on, "reconcile_on"),
        lease=seconds(lease, option="lease"),
        wait=seconds(wait, option="wait", allow_zero=True),
        retention=seconds(retention, option="retention"),
        replay_safe=bool(replay_safe),
        on_mismatch=_enum(OnMismatch, on_mismatch, "on_mismatch"),
        maybe_applied=classifier(maybe_applied),
        terminal=terminal_classifier(terminal),
        max_attempts=attempts(max_attempts),
        max_result_bytes=_positive_int(max_result_bytes, "max_result_bytes"),
        result_type=result_type,
        redact=redaction(redact),
    )
    if key is not None and not callable(key):
        raise ConfigurationError(f"key must be a function (args, ctx) -> str, not {key!r}")
    if reconcile is not None and not callable(reconcile):
        raise ConfigurationError(
            f"reconcile must be a function (key, args, ctx) -> result, not {reconcile!r}"
        )
    if options.reconcile_on is ReconcileOn.ALWAYS and reconcile is None:
        raise ConfigurationError('reconcile_on="always" needs a reconcile hook')

    def decorate(func: Callable[P, R]) -> Effect[P, R]:
        if not callable(func):
            raise ConfigurationError(f"@effect decorates a function, not {func!r}")
        chosen = check_name(name if name is not None else default_name(func))
        return Effect(func, dataclasses.replace(options, name=chosen))

    if fn is not None:
        return decorate(fn)
    return decorate


def _enum(cls: Any, value: Any, option: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in cls)
        raise ConfigurationError(f"{option} must be one of {choices}, not {value!r}") from None


def _positive_int(value: Any, option: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(f"{option} must be a positive integer, not {value!r}")
    return value
