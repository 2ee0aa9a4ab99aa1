"""Results as JSON, typed by the effect's return annotation (pydantic).

A replay returns the type the function returns: a model stays a model, a
dataclass a dataclass, a ``datetime`` a ``datetime``. Without an annotation the
result is plain JSON (dicts, lists, numbers, strings). Never pickle.

An effect's ``redact`` function is applied here, to every value on its way to the
store (a completion, a reconcile's find, a background retry), and what it returns
must read back as the return type: a replay returns it. ``redact=NOTHING`` records
no result at all (:attr:`~effectq.store.base.ResultState.WITHHELD`).
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic.errors import PydanticSchemaGenerationError
from pydantic_core import SchemaValidator

from .errors import ConfigurationError
from .options import NOTHING, Redact, is_time_limit
from .store.base import ResultState

__all__ = ["ResultCodec", "result_annotation"]

_STORED = ResultState.STORED  # every first time encodes: a global, not an Enum class's attribute

_ITERATORS: set[Any] = {
    collections.abc.Iterator,
    collections.abc.Iterable,
    collections.abc.Generator,
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.AsyncGenerator,
}


def result_annotation(fn: Callable[..., Any], *, name: str) -> Any:
    """The type an effect records: the return annotation, or the item type of a generator.

    Only the return annotation is resolved (parameter annotations may name local
    types that need not resolve); a string annotation is evaluated in the
    function's globals and closure, as ``typing.get_type_hints`` would.
    """
    annotation = inspect.get_annotations(fn).get("return", Any)
    if isinstance(annotation, str):
        try:
            scope = dict(inspect.getclosurevars(fn).nonlocals)
        except (TypeError, ValueError):
            scope = {}
        try:
            annotation = eval(annotation, getattr(fn, "__globals__", {}), scope)  # noqa: S307
        except Exception as exc:
            raise ConfigurationError(
                f"effect {name}: its return annotation {annotation!r} cannot be resolved ({exc}); "
                f"pass result_type=... to the effect"
            ) from exc
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin in _ITERATORS and args:
            return args[0]
        return Any
    return annotation


class ResultCodec:
    """Encodes results to JSON bytes and back, for one effect."""

    __slots__ = ("_adapter", "_name", "_redact", "decode")

    def __init__(self, annotation: Any, *, name: str, redact: Redact = None) -> None:
        self._name = name
        self._redact = redact
        try:
            self._adapter: TypeAdapter[Any] = TypeAdapter(annotation)
        except (PydanticSchemaGenerationError, TypeError) as exc:
            raise ConfigurationError(
                f"effect {name} returns {annotation!r}, which cannot be recorded as JSON: "
                f"annotate the return as a pydantic model, a dataclass or JSON types, or pass "
                f"result_type=..."
            ) from exc
        validator = self._adapter.validator  # a mock until built, for a deferred schema
        self.decode: Callable[[bytes], Any] = (
            validator.validate_json if isinstance(validator, SchemaValidator) else self._adapter.validate_json
        )
        """The recorded result, validated as the return type (raises ValidationError): the
        validator's own method, as ``TypeAdapter.validate_json`` calls it with no options, without
        the calls around it (every replay decodes)."""

    def encode(self, value: Any, limit: int) -> tuple[bytes | None, ResultState, str]:
        """Bytes to record, their state, and why they were not stored (if not)."""
        if self._redact is not None:
            return self._encode_redacted(value, limit)
        try:
            data = self._adapter.dump_json(value)
        except Exception as exc:
            if is_time_limit(exc):  # the worker's, landed here: no verdict on the value
                raise
            return None, ResultState.UNSERIALISABLE, f"{type(exc).__name__}: {exc}"[:300]
        if len(data) > limit:
            return None, ResultState.TOO_LARGE, f"{len(data)} bytes over the {limit}-byte bound"
        return data, _STORED, ""

    def _encode_redacted(self, value: Any, limit: int) -> tuple[bytes | None, ResultState, str]:
        """:meth:`encode` of what ``redact`` keeps of ``value``: checked to read back as the
        return type, or else recorded as applied without a result (it did apply)."""
        redact = self._redact
        if redact is NOTHING:
            return None, ResultState.WITHHELD, ""
        assert callable(redact)
        try:
            kept = redact(value)
            data = self._adapter.dump_json(kept, warnings="error")
            self._adapter.validate_json(data)
        except Exception as exc:
            if is_time_limit(exc):
                raise
            why = f"redact gave what does not record as the return type: {type(exc).__name__}: {exc}"
            return None, ResultState.UNSERIALISABLE, why[:300]
        if len(data) > limit:
            return None, ResultState.TOO_LARGE, f"{len(data)} bytes over the {limit}-byte bound"
        return data, ResultState.STORED, ""

    def coerce(self, value: Any) -> Any:
        """A value found by reconcile, validated as the return type."""
        return self._adapter.validate_python(value)


DecodeError = ValidationError
