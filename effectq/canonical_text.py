"""The text of a canonical tree: RFC 8785's numbers and member order, as fast as Python writes JSON.

:mod:`effectq.canonical` turns an input into a tree of JSON types and says whether it holds
anything special: a float RFC 8785 writes otherwise than Python (from 1e-9 up to 1e-4, or
integral from 2**53 up to 1e21, held as a :class:`Number`), or member names beyond U+FFFF
that sort otherwise by UTF-16 code units. This module writes that tree. A tree without
either is written by the C encoder of :mod:`json`, made once; a special one by
:func:`rfc_text`, the slower writer of the whole rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["ENCODER", "Number", "has_astral", "number_text", "reordered", "rfc_text", "tree_text"]

ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))
_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encoder = (
    None
    if _make_encoder is None
    else _make_encoder(
        None, ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, False
    )
)
_quote = json.encoder.encode_basestring  # RFC 8785's escapes: ", \ and U+0000-U+001F, lowercase hex


def tree_text(tree: Any) -> str:
    """``ENCODER.encode(tree)``, without building an encoder per call.

    The same C encoder ``JSONEncoder.encode`` makes on every call, made once; no
    circular-reference markers, since a canonical tree is built fresh (and the
    canonicaliser refuses cycles itself). For a tree without :class:`Number` and
    without member names beyond U+FFFF its text is RFC 8785's: the C encoder writes
    floats of 1e-4 up to 1e16 as ECMAScript does, and sorts names by code point, which
    is UTF-16 order for names of the Basic Multilingual Plane.
    """
    if _c_encoder is None:  # pragma: no cover - interpreters without the C accelerator
        return ENCODER.encode(tree)
    return "".join(_c_encoder(tree, 0))


def number_text(value: float) -> str:
    """A finite float as RFC 8785 (ECMAScript's ``Number.prototype.toString``) writes it.

    The digits are Python's shortest round-trip digits (``repr``), placed as
    ECMAScript places them: plain from 1e-6 up to 1e21, else ``d.ddde±x``.
    """
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    point = len(whole) + (int(exponent) if exponent else 0) - (len(whole + fraction) - len(digits))
    digits = digits.rstrip("0")  # value == 0.digits * 10**point
    count = len(digits)
    if count <= point <= 21:
        return sign + digits + "0" * (point - count)
    if 0 < point <= 21:
        return sign + digits[:point] + "." + digits[point:]
    if -6 < point <= 0:
        return sign + "0." + "0" * -point + digits
    power = point - 1
    mark = "+" if power >= 0 else "-"
    head = digits if count == 1 else digits[0] + "." + digits[1:]
    return f"{sign}{head}e{mark}{abs(power)}"


class Number:
    """A float whose RFC 8785 text is not Python's (1e-9 up to 1e-4, or integral from 2**53 up to 1e21)."""

    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value


def _utf16(name: str) -> bytes:
    return name.encode("utf-16-be", "surrogatepass")


def has_astral(name: str) -> bool:
    """Whether ``name`` has a character beyond U+FFFF (two UTF-16 code units)."""
    return not name.isascii() and max(name) > "\uffff"


def reordered(names: Mapping[str, Any]) -> bool:
    """Whether UTF-16 order and code point order of these names differ (never without an astral one)."""
    return sorted(names) != sorted(names, key=_utf16)


def _write(node: Any, out: list[str]) -> None:
    """Append RFC 8785 text of a canonical tree to ``out`` (any tree; :func:`tree_text` is the fast one)."""
    cls = type(node)
    if cls is str:
        out.append(_quote(node))
    elif cls is dict:
        out.append("{")
        for i, name in enumerate(sorted(node, key=_utf16)):
            if i:
                out.append(",")
            out.append(_quote(name))
            out.append(":")
            _write(node[name], out)
        out.append("}")
    elif cls is list:
        out.append("[")
        for i, item in enumerate(node):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    elif cls is Number:
        out.append(number_text(node.value))
    elif cls is float:
        out.append(number_text(node))
    else:  # int, bool, None
        out.append(json.dumps(node))


def rfc_text(tree: Any, special: bool) -> str:
    """RFC 8785 text of a canonical tree; ``special``: whether :func:`tree_text` would write it otherwise."""
    if not special:
        return tree_text(tree)
    out: list[str] = []
    _write(tree, out)
    return "".join(out)
