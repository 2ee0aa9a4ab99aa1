"""A terminal exception, as it is recorded and raised again.

An exception an effect declares terminal (``terminal=``) is recorded as JSON: its type's
qualified name, its message (``str(exc)``) and its arguments. The arguments are
``exc.effectq_args`` when the exception has that attribute (a list of JSON values, for a type
whose constructor does not take its ``args`` back), else ``exc.args``; ``null`` when they are
not JSON. Every later call with the key raises ``type(*arguments)`` again, when that imports
and gives the same message; else :class:`~effectq.errors.RecordedFailure`, which carries the
type name and the message. The function never runs.
"""

from __future__ import annotations

import importlib
import json
from typing import Any

from .._exceptions import describe_exception
from ..errors import RecordedFailure

__all__ = ["MAX_ARGS_BYTES", "MAX_MESSAGE", "fail_kwargs", "rebuilt", "record"]

MAX_MESSAGE = 2000
"""Characters of a terminal exception's message kept (a longer one is cut; a rebuilt exception's
message is compared cut the same way)."""

MAX_ARGS_BYTES = 8 * 1024
"""Bytes of JSON arguments kept; larger ones are recorded as ``null``."""


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def record(exc: BaseException) -> str:
    """The JSON recorded for the terminal exception ``exc``."""
    message = _cut(str(exc))
    given = getattr(exc, "effectq_args", exc.args)
    try:
        args: Any = json.dumps(list(given), ensure_ascii=False, allow_nan=False)
        if len(args.encode()) > MAX_ARGS_BYTES:
            args = "null"
    except (TypeError, ValueError):
        args = "null"
    head = json.dumps({"type": _qualname(type(exc)), "message": message}, ensure_ascii=False)
    return f'{head[:-1]}, "args": {args}}}'


def fail_kwargs(exc: BaseException, retention_ms: int) -> dict[str, Any]:
    """``Store.fail``'s keyword arguments for the terminal exception ``exc``."""
    return {"error": describe_exception(exc), "failure": record(exc), "retention_ms": retention_ms}


def rebuilt(failure: str, *, key: str, name: str, namespace: str) -> BaseException:
    """The exception a FAILED record's ``failure`` (:func:`record`'s JSON) raises again."""
    try:
        data = json.loads(failure)
        type_name, message, args = str(data["type"]), str(data["message"]), data.get("args")
    except (ValueError, TypeError, KeyError):
        return RecordedFailure(key, name, "?", failure[:200], "null", "the record is not readable", namespace)
    args_json = json.dumps(args, ensure_ascii=False)
    cls = _import(type_name)
    if cls is None:
        detail = "its type does not import here"
    else:
        try:
            exc = cls(*args) if isinstance(args, list) else cls(message)
        except Exception as error:  # a constructor that does not take its arguments back
            detail = f"{type_name}(*args) raised {type(error).__name__}"
        else:
            if _cut(str(exc)) == message:
                exc.__cause__ = RecordedFailure(key, name, type_name, message, args_json, "", namespace)
                return exc
            detail = f"{type_name}(*args) gives another message"
    return RecordedFailure(key, name, type_name, message, args_json, detail, namespace)


def _cut(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 1] + "…"


def _import(type_name: str) -> type[Exception] | None:
    """The exception class named ``module.Qual.Name``, or None."""
    parts = type_name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        except Exception:  # a module that fails to import for another reason
            return None
        for attr in parts[cut:]:
            value = getattr(value, attr, None)
        if isinstance(value, type) and issubclass(value, Exception):
            return value
        return None
    return None
