"""The switch for tests and local development: effects run as plain functions.

``EFFECTQ_DISABLED=1`` in the environment (read once, when effectq's decorator module
first loads), or ``with effectq.disabled():`` (for the whole process while the block
runs, in every thread), turns every effect into its plain function: no run is needed,
no store is touched, no key is hashed, nothing is recorded, and nothing stops a second
application. The first call under the switch warns once per process with
:class:`EffectsDisabledWarning`, naming the switch; production code never turns it on
silently (``warnings.filterwarnings("error", category=EffectsDisabledWarning)`` makes every call
under it raise instead).

What still holds under the switch: arguments that do not bind raise ``TypeError`` as the
function would; an input the default key cannot canonicalise raises
:class:`~effectq.errors.InvalidInputError`, as it would before a claim (a key function
is not called: it needs a run); a return annotation that cannot be recorded raises
:class:`~effectq.errors.ConfigurationError`. ``current_effect()`` works inside the
function; its key is ``disabled:<name>:<random>``, new for every call, so its
``idempotency_key`` dedupes nothing downstream either.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

from .canonical import key_bytes
from .context import EffectContext, bind_effect, unbind_effect
from .errors import ConfigurationError
from .events import EventKind
from .keys import legacy_keys
from .outcome import Outcome, Streamed
from .runs import active_run

if TYPE_CHECKING:
    from .wrapped import Wrapped

__all__ = ["DISABLED_VARIABLE", "EffectsDisabledWarning", "disabled", "is_disabled"]

DISABLED_VARIABLE = "EFFECTQ_DISABLED"

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


class EffectsDisabledWarning(UserWarning):
    """Effects run as plain functions (``EFFECTQ_DISABLED`` or ``effectq.disabled()``): at most
    once is not kept. Warned once per process, at the first call under the switch."""


def _from_environment() -> bool:
    value = os.environ.get(DISABLED_VARIABLE, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(
        f"{DISABLED_VARIABLE}={os.environ[DISABLED_VARIABLE]!r} is neither on (1, true, yes, on) "
        f"nor off (0, false, no, off, empty)"
    )


_ENVIRONMENT = _from_environment()
_lock = threading.Lock()
_warning_lock = threading.Lock()
_depth = 0  # open ``disabled()`` blocks
on = _ENVIRONMENT
"""Whether effects are disabled now: the one flag a call reads (a module global, no lock)."""
_warned = False


def _reset_warning() -> None:
    global _warned
    _warned = False


os.register_at_fork(after_in_child=_reset_warning)


def is_disabled() -> bool:
    """Whether effects run as plain functions now."""
    return on


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run every effect as its plain function while the block runs (tests, local development).

    Process-wide (every thread), nestable. See the module's notes for what still holds.

        with effectq.disabled():
            assert charge("o1", 500) == "ch_1"   # no run, no Redis, nothing recorded
    """
    global _depth, on
    with _lock:
        _depth += 1
        on = True
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            on = _ENVIRONMENT or _depth > 0


def _warn(name: str) -> None:
    """Warn once per process; where the warning is an error, every call under the switch raises."""
    global _warned
    if _warned:
        return
    with _warning_lock:
        if _warned:
            return
        switch = f"{DISABLED_VARIABLE}=1" if _ENVIRONMENT else "effectq.disabled()"
        warnings.warn(
            f"effectq effects are disabled by {switch}: effect {name} and every other runs as a "
            f"plain function, nothing recorded and nothing applied at most once; for tests and "
            f"local development only",
            EffectsDisabledWarning,
            stacklevel=5,
        )
        _warned = True


def call_plain(effect: Wrapped, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``effect``'s function as a plain function, after the checks that need no run."""
    return _called(effect, _context(effect, args, kwargs), args, kwargs, None)


def plain_outcome(effect: Wrapped, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome[Any]:
    """:func:`call_plain` of a synchronous effect, as ``call_with_outcome`` returns it: executed."""
    ctx = _context(effect, args, kwargs)
    return Outcome(_called(effect, ctx, args, kwargs, None), EventKind.EXECUTED, ctx.key)


async def plain_outcome_async(effect: Wrapped, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome[Any]:
    """:func:`plain_outcome` of an async effect."""
    ctx = _context(effect, args, kwargs)
    return Outcome(await _called(effect, ctx, args, kwargs, None), EventKind.EXECUTED, ctx.key)


def plain_stream(effect: Wrapped, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Streamed[Any]:
    """:func:`call_plain` of a generator effect, as ``stream_with_outcome`` returns it."""
    ctx = _context(effect, args, kwargs)
    end: list[Any] = []
    return Streamed(_called(effect, ctx, args, kwargs, end), end, ctx.key)


def _called(
    effect: Wrapped, ctx: EffectContext, args: tuple[Any, ...], kwargs: dict[str, Any], end: Any
) -> Any:
    kind, fn = effect._invoke_kind, effect.fn
    if kind == "sync":
        token = bind_effect(ctx)
        try:
            return fn(*args, **kwargs)
        finally:
            unbind_effect(token)
    if kind == "async":
        return _awaited(fn, ctx, args, kwargs)
    if kind == "gen":
        return _items(fn, ctx, args, kwargs, end)
    return _async_items(fn, ctx, args, kwargs, end)


def _context(effect: Wrapped, args: tuple[Any, ...], kwargs: dict[str, Any]) -> EffectContext:
    _warn(effect.name)
    bound = effect._signature.bind(*args, **kwargs)  # TypeError, as the function would raise
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    effect.codec  # noqa: B018 - an unrecordable return type fails here, as it would in a run
    if effect.options.key is None:
        key_bytes(effect._keyed(arguments), legacy=legacy_keys())  # InvalidInputError
    run = active_run()
    key = f"disabled:{effect.name}:{uuid.uuid4().hex}"
    return EffectContext(key, run.id if run is not None else "", effect.name, 1, "", 0, 0, arguments)


async def _awaited(fn: Any, ctx: EffectContext, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    token = bind_effect(ctx)
    try:
        return await fn(*args, **kwargs)
    finally:
        unbind_effect(token)


def _items(
    fn: Any, ctx: EffectContext, args: tuple[Any, ...], kwargs: dict[str, Any], end: list[Any] | None
) -> Iterator[Any]:
    items = fn(*args, **kwargs)
    last: Any = None
    try:
        while True:
            token = bind_effect(ctx)
            try:
                item = next(items)
            except StopIteration:
                if end is not None:
                    end.append((last, EventKind.EXECUTED))
                return
            finally:
                unbind_effect(token)
            last = item
            yield item
    finally:
        items.close()


async def _async_items(
    fn: Any, ctx: EffectContext, args: tuple[Any, ...], kwargs: dict[str, Any], end: list[Any] | None
) -> AsyncIterator[Any]:
    items = fn(*args, **kwargs).__aiter__()
    last: Any = None
    try:
        while True:
            token = bind_effect(ctx)
            try:
                item = await items.__anext__()
            except StopAsyncIteration:
                if end is not None:
                    end.append((last, EventKind.EXECUTED))
                return
            finally:
                unbind_effect(token)
            last = item
            yield item
    finally:
        await items.aclose()
