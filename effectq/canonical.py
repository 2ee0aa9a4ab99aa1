"""Canonical JSON: one byte string for one input, whatever order it was built in.

The default effect key hashes the canonical JSON of the bound arguments, so two
calls with equal input must produce equal bytes, and unequal input different
bytes. The bytes are those of RFC 8785, the JSON Canonicalization Scheme (JCS), so
a service in another language that hashes JCS computes the same key:

* object members are sorted by their names' UTF-16 code units; strings are
  UTF-8, with only ``"``, ``\\`` and control characters escaped; a lone
  surrogate is refused (it is not Unicode text);
* numbers are written as ECMAScript writes them (``1e+21``, ``1e-7``,
  ``0.000001``, ``10000000000000000``); ``NaN`` and ``Infinity`` are refused;
  a float with an integral value is the integer (``1.0`` and ``1`` are the same
  input); ``-0.0`` is ``0``;
* an ``int`` is written with all its digits. Within ±2**53 that is RFC 8785's
  form; beyond it RFC 8785 has only doubles, which would make two different large
  ids one input, so effectq keeps every digit (an id a JavaScript number cannot
  hold exactly should travel as a string);
* tuples are lists; sets and frozensets are lists sorted by the canonical
  bytes of their members;
* ``datetime``/``date``/``time`` are ISO 8601 strings, ``timedelta`` is seconds,
  ``UUID`` its string, ``Decimal`` its normalised string (``1.10`` == ``1.1``),
  ``Enum`` its value, ``bytes`` is ``{"$bytes": base64}``, ``PurePath`` its
  POSIX string;
* dataclass instances and pydantic models are objects of their fields
  (pydantic's ``model_dump()``, then these same rules);
* anything else (and any cycle) is an :class:`~effectq.errors.InvalidInputError`
  that names the argument and the path inside it. An object's ``str()``,
  ``repr()`` and pickle are never used: they are not stable across processes or
  versions.

Key scheme 1 (``legacy``), effectq's bytes before RFC 8785, is kept for the
upgrade: it differs only for floats from 1e-9 up to 1e-4 in magnitude or integral
from 2**53 up to 1e21, and for objects whose member names, some beyond U+FFFF,
sort otherwise by UTF-16 code units than by code points. :func:`key_bytes` gives both when they
differ; see ``docs/keys.md``.

This module builds the tree of JSON types and the bytes; :mod:`effectq.canonical_text`
writes the tree as text.
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

from .canonical_text import ENCODER, Number, has_astral, number_text, reordered, rfc_text, tree_text
from .errors import InvalidInputError

__all__ = [
    "MAX_DEPTH",
    "canonical_arguments",
    "canonical_hash",
    "canonical_json",
    "canonicalize",
    "key_bytes",
    "number_text",
]

MAX_DEPTH = 100
"""Deepest nesting accepted in an input; deeper input is refused with a clear error."""

_SCALARS = (str, int, bool, type(None))
_MAX_EXACT = 2**53


def canonical_json(value: Any, *, argument: str = "input") -> bytes:
    """Return the canonical (RFC 8785) JSON bytes of ``value``.

    Args:
        value: the input.
        argument: the name used in error messages (an argument name).

    Raises:
        InvalidInputError: the value (or something inside it) cannot be canonicalised.
    """
    canon = _Canon(argument)
    tree = canon.convert(value, argument, 0)
    return _utf8(rfc_text(tree, canon.special), {argument: tree})


def canonical_hash(value: Any, *, argument: str = "input") -> str:
    """Return the sha256 hex digest of ``canonical_json(value)``."""
    return hashlib.sha256(canonical_json(value, argument=argument)).hexdigest()


def canonicalize(value: Any, *, argument: str = "input") -> Any:
    """Return a tree of JSON types (dict/list/str/int/float/bool/None) for ``value``.

    A float whose RFC 8785 text Python does not write is in the tree as an
    ``int`` (integral floats) or as the float itself (render it with
    :func:`number_text`).
    """
    return _plain(_Canon(argument).convert(value, argument, 0))


def _plain(node: Any) -> Any:
    cls = type(node)
    if cls is Number:
        value = node.value
        return int(number_text(value)) if value.is_integer() and abs(value) < 1e21 else value
    if cls is dict:
        return {name: _plain(item) for name, item in node.items()}
    if cls is list:
        return [_plain(item) for item in node]
    return node


class _Canon:
    __slots__ = ("_active", "_argument", "legacy", "special")

    def __init__(self, argument: str, legacy: bool = False) -> None:
        self._argument = argument
        self._active: set[int] = set()
        self.legacy = legacy
        self.special = False
        """Whether the tree holds what RFC 8785 and key scheme 1 may write differently."""

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
        magnitude = abs(value)
        if value.is_integer():
            if magnitude < _MAX_EXACT:
                return int(value)
            if magnitude >= 1e21:  # Python writes it as ECMAScript does: 1e+21, 1.5e+300
                return value
        elif magnitude >= 1e-4 or magnitude < 1e-9:  # as ECMAScript too: 0.5, 1.5e-10, 5e-324
            return value
        self.special = True  # 1e-9 up to 1e-4 (1e-07, 1e-05), or integral from 2**53 up to 1e21
        return value if self.legacy else Number(value)

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
            astral = False
            for k, v in value.items():
                name = self._key(k, path)
                if name in out:
                    raise self.fail(path, f"two keys both become {name!r}")
                astral = astral or has_astral(name)
                out[name] = self.convert(v, f"{path}.{name}", depth + 1)
            if astral and reordered(out):
                self.special = True
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
            number = self._float(key, path)
            return number_text(number.value) if type(number) is Number else ENCODER.encode(number)
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
        if self.legacy:
            return sorted(items, key=ENCODER.encode)
        return sorted(items, key=lambda item: rfc_text(item, self.special))

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


def _utf8(text: str, trees: Mapping[str, Any]) -> bytes:
    """``text`` as UTF-8; a lone surrogate in it is an InvalidInputError naming where it is."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        for name, tree in trees.items():
            path = _surrogate_at(tree, name)
            if path is not None:
                raise _Canon(name).fail(
                    path, "it holds a lone surrogate (U+D800-U+DFFF), which is not Unicode text"
                ) from None
        raise  # pragma: no cover - every string of the text is in one of the trees


def _surrogate_at(node: Any, path: str) -> str | None:
    if type(node) is str:
        try:
            node.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if type(node) is dict:
        for name, item in node.items():
            found = _surrogate_at(name, path) or _surrogate_at(item, f"{path}.{name}")
            if found is not None:
                return found
    elif type(node) is list:
        for i, item in enumerate(node):
            found = _surrogate_at(item, f"{path}[{i}]")
            if found is not None:
                return found
    return None


def _canonical(arguments: Mapping[str, Any], legacy: bool) -> tuple[bytes, bool]:
    """The bytes of bound arguments under one scheme, and whether the other may differ."""
    for name, value in arguments.items():
        if type(value) not in _SCALARS or not name.isascii():
            break
    else:  # already canonical, and the same under both schemes
        text = tree_text(arguments)
        try:
            return text.encode("utf-8"), False
        except UnicodeEncodeError:  # a lone surrogate: _utf8 says where
            return _utf8(text, arguments), False
    tree: dict[str, Any] = {}
    special = False
    for name, value in arguments.items():
        canon = _Canon(name, legacy)
        tree[name] = canon.convert(value, name, 0)
        special = special or canon.special
    if not special and any(has_astral(name) for name in tree) and reordered(tree):
        special = True
    text = tree_text(tree) if legacy else rfc_text(tree, special)
    return _utf8(text, tree), special


def canonical_arguments(arguments: Mapping[str, Any], *, legacy: bool = False) -> bytes:
    """Canonical JSON of bound arguments; an error names the argument at fault.

    ``legacy``: key scheme 1's bytes (effectq's before RFC 8785) instead of RFC 8785's.
    """
    return _canonical(arguments, legacy)[0]


def key_bytes(arguments: Mapping[str, Any], *, legacy: bool = False) -> tuple[bytes, bytes | None]:
    """Canonical JSON of bound arguments under one key scheme, and under the other when it differs.

    The second is ``None`` for nearly every input: the schemes differ only for a few
    floats and member names (see the module's notes), and only then is it computed.
    """
    data, special = _canonical(arguments, legacy)
    if not special:
        return data, None
    other = _canonical(arguments, not legacy)[0]
    return data, None if other == data else other
