"""Tool sets for agents: side-effecting tools become effects, read-only tools pass through.

    tools = effectq.wrap_tools(
        {"lookup_order": lookup_order, "refund": refund, "send_email": send_email},
        effects={"refund": {"key_args": ["order_id"]}, "send_email": {}},
        allow=lambda name: name in granted,
    )
    result = tools[call.name](**json.loads(call.arguments))

Each tool named in ``effects`` becomes an effect named ``tool.<name>`` (options
as for :func:`effectq.effect`); a tool that already is an effect stays one. The
default key hashes the tool's arguments and nothing else: a tool-call id never
reaches it, nor does a framework's call context (pydantic-ai's ``RunContext``,
which holds the id). So when the model asks for the same call again under a new
id, re-planned after a retry or five times in one turn, it applies once; the
later calls get the recorded result, and parallel identical calls in one
process share one execution.

Tools not named in ``effects`` are read-only: they are returned unchanged, or,
when ``allow`` is given, behind the same check as every other tool. ``allow``
is asked on every call, so a permission revoked mid-run stops the next call;
a refused call raises :class:`ToolNotAllowed` and runs nothing.

The wrappers are plain functions (``async def`` for an async tool) with the
tool's name, docstring and signature, so frameworks that read them (pydantic-ai
builds the JSON schema from the signature) see the original tool.
"""

from __future__ import annotations

import functools
import inspect
import logging
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from datetime import timedelta
from typing import Any, TypedDict, overload

from ..context import EffectContext, KeyContext
from ..effect import Effect, effect
from ..errors import ConfigurationError, ToolNotAllowed
from ..options import OnMismatch, ReconcileOn

__all__ = ["ToolNotAllowed", "ToolOptions", "wrap_tools"]

log = logging.getLogger("effectq.refuse")

Tool = Callable[..., Any]
Allow = Callable[[str], bool]

_RUN_CONTEXT = re.compile(r"(?:[\w.]+\.)?RunContext\b")


class ToolOptions(TypedDict, total=False):
    """Options of one side-effecting tool: those of :func:`effectq.effect`."""

    name: str
    key: Callable[[dict[str, Any], KeyContext], str]
    key_args: Iterable[str]
    reconcile: Callable[[str, dict[str, Any], EffectContext], Any]
    reconcile_on: ReconcileOn | str
    replay_safe: bool
    lease: float | timedelta
    wait: float | timedelta
    retention: float | timedelta
    on_mismatch: OnMismatch | str
    maybe_applied: Iterable[type[BaseException] | str] | Callable[[BaseException], bool]
    terminal: Iterable[type[BaseException] | str]
    max_attempts: int
    max_result_bytes: int
    result_type: Any


@overload
def wrap_tools(
    tools: Mapping[str, Tool],
    *,
    effects: Mapping[str, ToolOptions] | Sequence[str] | AbstractSet[str] = (),
    allow: Allow | None = None,
    prefix: str = "tool.",
) -> dict[str, Tool]: ...


@overload
def wrap_tools(
    tools: Iterable[Tool],
    *,
    effects: Mapping[str, ToolOptions] | Sequence[str] | AbstractSet[str] = (),
    allow: Allow | None = None,
    prefix: str = "tool.",
) -> list[Tool]: ...


def wrap_tools(
    tools: Mapping[str, Tool] | Iterable[Tool],
    *,
    effects: Mapping[str, ToolOptions] | Sequence[str] | AbstractSet[str] = (),
    allow: Allow | None = None,
    prefix: str = "tool.",
) -> dict[str, Tool] | list[Tool]:
    """Make the side-effecting tools of a tool set apply at most once per key.

    Args:
        tools: a mapping of tool name to function (as for OpenAI or Anthropic
            function calling), or a list of functions named by ``__name__`` (as
            for ``pydantic_ai.Agent(tools=...)``). Effects may be among them.
        effects: the side-effecting tools, by name: a list of names, or a mapping
            of name to :class:`ToolOptions` (``key``, ``key_args``, ``reconcile``,
            ``replay_safe``, ...). Each becomes an effect named ``prefix + name``.
        allow: ``allow(tool_name) -> bool``, asked before every call of every
            tool; a refused call raises :class:`ToolNotAllowed` and runs nothing.
        prefix: the effect name of a tool is ``prefix + tool name``.

    Returns:
        The same shape as ``tools``: a dict, or a list in the same order.
    """
    named = _named(tools)
    if isinstance(effects, str):
        raise ConfigurationError(f"effects takes a list of tool names, not the string {effects!r}")
    chosen: Mapping[str, ToolOptions] = (
        effects if isinstance(effects, Mapping) else {name: ToolOptions() for name in effects}
    )
    missing = sorted(set(chosen) - set(named))
    if missing:
        raise ConfigurationError(
            f"effects names {missing}, which the tool set does not have: {sorted(named)}"
        )
    if allow is not None and not callable(allow):
        raise ConfigurationError(f"allow must be a function (tool_name) -> bool, not {allow!r}")
    wrapped = {
        name: _wrap(name, fn, chosen.get(name), allow=allow, prefix=prefix) for name, fn in named.items()
    }
    if isinstance(tools, Mapping):
        return wrapped
    return list(wrapped.values())


def _named(tools: Mapping[str, Tool] | Iterable[Tool]) -> dict[str, Tool]:
    if isinstance(tools, Mapping):
        named = dict(tools)
    else:
        named = {}
        for fn in tools:
            name = getattr(fn, "__name__", None)
            if not isinstance(name, str):
                raise ConfigurationError(
                    f"a tool in a list needs a __name__; pass a dict of name -> tool ({fn!r})"
                )
            if name in named:
                raise ConfigurationError(f"two tools are named {name!r}; pass a dict of name -> tool")
            named[name] = fn
    for name, fn in named.items():
        if not callable(fn):
            raise ConfigurationError(f"tool {name!r} is not callable: {fn!r}")
    return named


def _wrap(name: str, tool: Tool, options: ToolOptions | None, *, allow: Allow | None, prefix: str) -> Tool:
    if isinstance(tool, Effect):
        if options is not None:
            raise ConfigurationError(
                f"tool {name!r} already is an effect ({tool.name}); give its options to @effectq.effect"
            )
        return _gate(name, tool.fn, tool, allow)
    if options is None:
        return tool if allow is None else _gate(name, tool, tool, allow)
    settings: dict[str, Any] = dict(options)
    settings.setdefault("name", prefix + name)
    if "key" not in settings and "key_args" not in settings:
        context = _context_params(tool)
        if context:
            settings["key_args"] = [p for p in inspect.signature(tool).parameters if p not in context]
    return _gate(name, tool, effect(**settings)(tool), allow)


def _gate(name: str, tool: Tool, target: Tool, allow: Allow | None) -> Tool:
    """A function that looks like ``tool`` (name, docstring, signature) and calls ``target``."""

    def check() -> None:
        if allow is not None and not allow(name):
            log.info("effectq refused tool %s: allow(%r) said no", name, name)
            raise ToolNotAllowed(name)

    if inspect.iscoroutinefunction(tool):

        @functools.wraps(tool)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            check()
            return await target(*args, **kwargs)

        return call_async

    @functools.wraps(tool)
    def call(*args: Any, **kwargs: Any) -> Any:
        check()
        return target(*args, **kwargs)

    return call


def _context_params(tool: Tool) -> tuple[str, ...]:
    """Parameters through which a framework passes its call context: never part of a key.

    pydantic-ai passes a ``RunContext`` (which carries the tool-call id) as the
    first parameter of a tool that declares one.
    """
    try:
        params = list(inspect.signature(tool).parameters.values())
    except (TypeError, ValueError):
        return ()
    if not params:
        return ()
    first = params[0]
    annotation = first.annotation
    if isinstance(annotation, str):
        return (first.name,) if _RUN_CONTEXT.match(annotation) else ()
    origin = typing.get_origin(annotation) or annotation
    module = getattr(origin, "__module__", "") or ""
    if getattr(origin, "__name__", None) == "RunContext" and module.startswith("pydantic_ai"):
        return (first.name,)
    return ()
