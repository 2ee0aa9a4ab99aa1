"""Steps: work that is safe to repeat but costly or nondeterministic, journaled by ordinal.

A model call, a random choice, a clock read: running one again costs money or
gives another answer, so a redelivered agent would re-pay its model and then
plan something else. A step records its result under its *ordinal*, the number
of calls of that step before it in the run::

    <run id>:<step name>:#<ordinal>

A redelivered run makes the same calls in the same order, so the Nth call of
step S in run R returns the journaled value without running:

    attempt 1   llm #0 runs, journaled  ->  refund applies, recorded  ->  SIGKILL
    attempt 2   llm #0 replays (not called: same plan)  ->  refund replays its result
                ->  llm #1 runs, journaled  ->  ...

A step is an effect (the engine claims, records and replays it) that differs in
three ways: the key is the ordinal, not the input; a step that raised, or whose
holder died mid-call, is never "maybe applied": it runs again (``replay_safe``,
and every exception releases); and the input is only compared. A replayed step
whose input differs from the journaled one *diverged*: the code, or something
the run read outside a step, changed between attempts. That warns and returns
the journaled value, or raises :class:`StepDivergedError` with
``on_mismatch="raise"``.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar, overload

from ..codec import result_annotation
from ..context import KeyContext
from ..effect import Effect, effect
from ..errors import ConfigurationError, InputMismatchError, StepDivergedError
from ..options import FROM_ANNOTATION, MAX_ATTEMPTS_LIMIT, OnMismatch

__all__ = ["Step", "StepDivergedError", "step"]

P = ParamSpec("P")
R = TypeVar("R")

_ORDINAL = ":#"

LEASE = 15.0
"""A step's default lease, in seconds: how long a redelivered run waits for a dead holder's step."""
WAIT = 60.0
"""How long a call waits by default for the same step in flight elsewhere (longer than the lease)."""
RETENTION = timedelta(days=7)
MAX_RESULT_BYTES = 1024 * 1024
"""A model response is larger than a typical effect's result."""


def _ordinal_key(args: dict[str, Any], ctx: KeyContext) -> str:
    return f"{ctx.run_id}:{ctx.name}{_ORDINAL}{ctx.ordinal}"


def _never_applied(exc: BaseException) -> bool:
    return False


class Step(Generic[P, R]):
    """A function whose results are journaled by ordinal within the bound run.

    Calling it inside a run returns the journaled result of this call's ordinal
    if there is one, or runs the function and journals its result. See
    :func:`step` for the options.
    """

    def __init__(self, journaled: Effect[P, R]) -> None:
        self.effect = journaled
        self.name = journaled.name
        self.fn = journaled.fn
        self._is_async = inspect.iscoroutinefunction(journaled.fn)
        functools.update_wrapper(self, journaled.fn)

    def __repr__(self) -> str:
        return f"<step {self.name}>"

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return types.MethodType(self, instance)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._is_async:
            # The call is prepared (its ordinal taken) now, in call order, not when awaited.
            return self._await(self.effect(*args, **kwargs))  # type: ignore[arg-type, return-value]
        try:
            return self.effect(*args, **kwargs)
        except InputMismatchError as exc:
            diverged = self._diverged(exc)
            if diverged is None:
                raise
            raise diverged from exc

    async def _await(self, call: Awaitable[Any]) -> Any:
        try:
            return await call
        except InputMismatchError as exc:
            diverged = self._diverged(exc)
            if diverged is None:
                raise
            raise diverged from exc

    def _diverged(self, exc: InputMismatchError) -> StepDivergedError | None:
        """This step's own error for a mismatch of this step; None for one of an effect it called."""
        if isinstance(exc, StepDivergedError) or exc.name != self.name:
            return None
        head, _, ordinal = exc.key.rpartition(_ORDINAL)
        return StepDivergedError(
            exc.key,
            name=exc.name,
            ordinal=int(ordinal),
            run_id=head[: -len(exc.name) - 1],
            recorded_hash=exc.recorded_hash,
            input_hash=exc.input_hash,
        )


def _journal(fn: Callable[..., Any], options: dict[str, Any]) -> Step[Any, Any]:
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise ConfigurationError(
            f"a step journals one return value, and {getattr(fn, '__qualname__', fn)!r} is a generator: "
            f"collect what it yields inside the step and return that"
        )
    journaled = effect(key=_ordinal_key, replay_safe=True, maybe_applied=_never_applied, **options)(fn)
    return Step(journaled)


_OPTIONS = frozenset(
    {"name", "key_args", "on_mismatch", "lease", "wait", "retention", "max_result_bytes", "result_type"}
    | {"max_attempts"}
)
_DEFAULTS = {
    "lease": LEASE,
    "wait": WAIT,
    "max_result_bytes": MAX_RESULT_BYTES,
    "max_attempts": MAX_ATTEMPTS_LIMIT,
}
"""Where a step's defaults differ from an effect's (see the overloads of :func:`step`)."""


def _decorator(**options: Any) -> Callable[[Callable[..., Any]], Step[Any, Any]]:
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"effectq.step() got unexpected options {unknown}; it takes {sorted(_OPTIONS)}")
    options = {**_DEFAULTS, **options}

    def decorate(fn: Callable[..., Any]) -> Step[Any, Any]:
        if not callable(fn):
            raise ConfigurationError(f"@effectq.step decorates a function, not {fn!r}")
        return _journal(fn, options)

    return decorate


def _pass_through(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A function taking anything, for a callable whose signature cannot be read (a builtin)."""
    if inspect.iscoroutinefunction(fn):

        async def call_async(*args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

        return call_async

    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return call


@overload
def step(fn: Callable[P, R], /) -> Step[P, R]: ...


@overload
def step(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    key_args: Iterable[str] | None = None,
    on_mismatch: OnMismatch | str = OnMismatch.WARN,
    lease: float | timedelta = LEASE,
    wait: float | timedelta = WAIT,
    retention: float | timedelta = RETENTION,
    max_result_bytes: int = MAX_RESULT_BYTES,
    result_type: Any = FROM_ANNOTATION,
    max_attempts: int = MAX_ATTEMPTS_LIMIT,
) -> Callable[[Callable[P, R]], Step[P, R]]: ...


@overload
def step(name: str, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...


def step(*args: Any, **kwargs: Any) -> Any:
    """Journal a function's results by ordinal: a decorator, bare or with options, or a call.

    As a decorator::

        @effectq.step(name="llm")
        def call_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
            return client.chat.completions.create(model=MODEL, messages=messages).model_dump()

    As a call, ``effectq.step(name, fn, *args, **kwargs)`` runs ``fn(*args, **kwargs)``
    as the step ``name`` (awaitable when ``fn`` is async)::

        delay = effectq.step("backoff.jitter", random.uniform, 0.5, 1.5)

    Either way the call needs a bound run, and its Nth call in the run returns
    the journaled result of the Nth call of an earlier attempt without running.

    Args:
        name: a stable name, part of the journal key; defaults to ``module.qualname``.
        key_args: only these arguments are compared on replay (all by default).
        on_mismatch: ``"warn"`` (the default: log and return the journaled value)
            or ``"raise"`` (:class:`StepDivergedError`) when a replayed call's input
            differs from the journaled one.
        lease: how long a silent holder keeps the step; a redelivered run waits
            that long for a dead holder's step before running it again.
        wait: how long a call waits for the same step in flight elsewhere.
        retention: how long the journal keeps a result.
        max_result_bytes: the largest result journaled (as JSON); a larger one
            cannot be replayed.
        result_type: the type results are journaled and replayed as; defaults to
            the return annotation.
        max_attempts: runs of one step (an attempt that raised, or whose worker died in
            it) before it is parked (``AttemptsExhausted``); 10 by default, the most an
            effect may have: a step journals, it is no side effect to stop at 3.
    """
    if args and isinstance(args[0], str):
        if len(args) < 2 or not callable(args[1]):
            raise ConfigurationError(
                "effectq.step(name, fn, *args, **kwargs) needs a function after the name"
            )
        name, fn, *call_args = args
        return _explicit(name, fn)(*call_args, **kwargs)
    if len(args) > 1 or (args and kwargs):
        raise ConfigurationError(
            "use @effectq.step bare, or @effectq.step(name=..., ...) with options by keyword"
        )
    decorate = _decorator(**kwargs)
    return decorate(args[0]) if args else decorate


def _explicit(name: str, fn: Callable[..., Any]) -> Step[Any, Any]:
    try:
        result_type = result_annotation(fn, name=name)
    except ConfigurationError:
        result_type = Any
    try:
        inspect.signature(fn)
    except (TypeError, ValueError):
        fn = _pass_through(fn)
    return _decorator(name=name, result_type=result_type)(fn)
