"""Canonical JSON: one byte string for one input, whatever order it was built in.

The default effect key hashes the canonical JSON of the bound arguments, so two
calls with equal input must produce equal bytes, and unequal input different
bytes. The rules:

* object keys are sorted; ``NaN`` and ``Infinity`` are refused;
* a float with an integral value is written as an integer (``1.0`` and ``1``
  are the same input, as in RFC 8785);
* tuples are lists; sets and frozensets are lists sorted by the canonical
  bytes of their members;
* ``datetime``/``date``/``time`` are ISO 8601 strings, ``timedelta`` is seconds,
  ``UUID`` its string, ``Decimal`` its normalised string (``1.10`` == ``1.1``),
  ``Enum`` its value, ``bytes`` is ``{"$bytes": base64}``, ``PurePath`` its
  POSIX string;
* dataclass instances and pydantic models are objects of their fields
  (pydantic's ``model_dump()``, then these same rules);
* anything else (and any cycle) is an :class:`~effectq.errors.InvalidInputError`
  that names the argument and the path inside it. ``str()``, ``repr()`` and
  pickle are never used: they are not stable across processes or versions.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import decimal
import enum
import hashlib
import json
import math
import uuid
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from .errors import InvalidInputError

__all__ = ["MAX_DEPTH", "canonical_arguments", "canonical_hash", "canonical_json", "canonicalize"]

MAX_DEPTH = 100
"""Deepest nesting accepted in an input; deeper input is refused with a clear error."""

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))
_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encoder = (
    None
    if _make_encoder is None
    else _make_encoder(
        None, _encoder.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
)


def _dumps(tree: Any) -> bytes:
    """``_encoder.encode(tree)`` as UTF-8, without building an encoder per call.

    The same C encoder ``JSONEncoder.encode`` makes on every call, made once; no
    circular-reference markers, since a canonical tree is built fresh (and the
    canonicaliser refuses cycles itself).
    """
    if _c_encoder is None:  # pragma: no cover - interpreters without the C accelerator
        return _encoder.encode(tree).encode("utf-8")
    return "".join(_c_encoder(tree, 0)).encode("utf-8")


_SCALARS = (str, int, bool, type(None))
_MAX_EXACT = 2**53


def canonical_json(value: Any, *, argument: str = "input") -> bytes:
    """Return the canonical JSON bytes of ``value``.

    Args:
        value: the input.
        argument: the name used in error messages (an argument name).

    Raises:
        InvalidInputError: the value (or something inside it) cannot be canonicalised.
    """
    tree = canonicalize(value, argument=argument)
    return _dumps(tree)


def canonical_hash(value: Any, *, argument: str = "input") -> str:
    """Return the sha256 hex digest of ``canonical_json(value)``."""
    return hashlib.sha256(canonical_json(value, argument=argument)).hexdigest()


def canonicalize(value: Any, *, argument: str = "input") -> Any:
    """Return a tree of JSON types (dict/list/str/int/float/bool/None) for ``value``."""
    return _Canon(argument).convert(value, argument, 0)


class _Canon:
    __slots__ = ("_active", "_argument")

    def __init__(self, argument: str) -> None:
        self._argument = argument
        self._active: set[int] = set()

    def fail(self, path: str, why: str) -> InvalidInputError:
        where = f"argument {path!r}" if path == self._argument else f"{path!r} in argument {self._argument!r}"
        return InvalidInputError(
            f"cannot build an effect key from {where}: {why}. Pass key=... to the effect "
            f"(or key_args=... to leave this argument out of the key).",
            argument=path,
        )

    def convert(self, value: Any, path: str, depth: int) -> Any:
        cls = type(value)
        if cls in _SCALARS:
            return value
        if cls is float:
            return self._float(value, path)
        if depth >= MAX_DEPTH:
            raise self.fail(path, f"nested deeper than {MAX_DEPTH} levels")
        if cls is list or cls is tuple:
            return self._sequence(value, path, depth)
        if cls is dict:
            return self._mapping(value, path, depth)
        return self._other(value, path, depth)

    def _float(self, value: float, path: str) -> Any:
        if math.isnan(value) or math.isinf(value):
            raise self.fail(path, f"{value!r} is not valid JSON")
        if value.is_integer() and abs(value) < _MAX_EXACT:
            return int(value)
        return value

    def _enter(self, value: Any, path: str) -> int:
        ident = id(value)
        if ident in self._active:
            raise self.fail(path, "it contains itself (a cycle)")
        self._active.add(ident)
        return ident

    def _sequence(self, value: Any, path: str, depth: int) -> list[Any]:
        ident = self._enter(value, path)
        try:
            return [self.convert(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        finally:
            self._active.discard(ident)

    def _mapping(self, value: Mapping[Any, Any], path: str, depth: int) -> dict[str, Any]:
        ident = self._enter(value, path)
        try:
            out: dict[str, Any] = {}
            for k, v in value.items():
                name = self._key(k, path)
                if name in out:
                    raise self.fail(path, f"two keys both become {name!r}")
                out[name] = self.convert(v, f"{path}.{name}", depth + 1)
            return out
        finally:
            self._active.discard(ident)

    def _key(self, key: Any, path: str) -> str:
        if isinstance(key, enum.Enum):
            key = key.value
        if isinstance(key, str):
            return str(key)
        if isinstance(key, bool) or key is None:
            return json.dumps(key)
        if isinstance(key, int):
            return str(int(key))
        if isinstance(key, uuid.UUID):
            return str(key)
        if isinstance(key, float):
            return _encoder.encode(self._float(key, path))
        raise self.fail(path, f"a mapping key of type {type(key).__qualname__} is not a string")

    def _other(self, value: Any, path: str, depth: int) -> Any:
        # Subclasses of the builtins, then the known value types, then structured objects.
        if isinstance(value, enum.Enum):
            return self.convert(value.value, path, depth + 1)
        if isinstance(value, bool):
            return bool(value)
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return self._float(float(value), path)
        if isinstance(value, str):
            return str(value)
        if isinstance(value, (bytes, bytearray, memoryview)):
            return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, _dt.datetime | _dt.date | _dt.time):
            return value.isoformat()
        if isinstance(value, _dt.timedelta):
            return self._float(value.total_seconds(), path)
        if isinstance(value, uuid.UUID):
            return str(value)
        if isinstance(value, decimal.Decimal):
            return self._decimal(value, path)
        if isinstance(value, PurePath):
            return value.as_posix()
        if isinstance(value, Mapping):
            return self._mapping(value, path, depth)
        if isinstance(value, (list, tuple)):
            return self._sequence(value, path, depth)
        if isinstance(value, (set, frozenset)):
            return self._set(value, path, depth)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return self._dataclass(value, path, depth)
        dump = getattr(value, "model_dump", None)
        if dump is not None and hasattr(type(value), "model_fields"):
            return self._pydantic(value, path, depth)
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        raise self.fail(path, f"an object of type {kind} has no canonical JSON form")

    def _decimal(self, value: decimal.Decimal, path: str) -> str:
        if not value.is_finite():
            raise self.fail(path, f"Decimal {value} is not a finite number")
        text = format(value.normalize(), "f")
        return "0" if text in ("-0", "0") else text

    def _set(self, value: Any, path: str, depth: int) -> list[Any]:
        ident = self._enter(value, path)
        try:
            items = [self.convert(item, f"{path}{{}}", depth + 1) for item in value]
        finally:
            self._active.discard(ident)
        return sorted(items, key=_encoder.encode)

    def _dataclass(self, value: Any, path: str, depth: int) -> dict[str, Any]:
        ident = self._enter(value, path)
        try:
            return {
                f.name: self.convert(getattr(value, f.name), f"{path}.{f.name}", depth + 1)
                for f in dataclasses.fields(value)
            }
        finally:
            self._active.discard(ident)

    def _pydantic(self, value: Any, path: str, depth: int) -> Any:
        ident = self._enter(value, path)
        try:
            dumped = value.model_dump()  # python mode: sets stay sets, to be sorted below
        except Exception as exc:  # a model whose fields cannot dump to JSON
            raise self.fail(path, f"pydantic could not dump it to JSON ({exc})") from exc
        finally:
            self._active.discard(ident)
        return self.convert(dumped, path, depth + 1)


def canonical_arguments(arguments: Mapping[str, Any]) -> bytes:
    """Canonical JSON of bound arguments; an error names the argument at fault."""
    if all(type(value) in _SCALARS for value in arguments.values()):  # already canonical
        return _dumps(arguments)
    tree = {name: _Canon(name).convert(value, name, 0) for name, value in arguments.items()}
    return _dumps(tree)
