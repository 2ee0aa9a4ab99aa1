"""Keys: canonical JSON of the input, key functions, idempotency keys and markers."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import math
import os
import subprocess
import sys
import uuid
from pathlib import PurePosixPath
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import effectq
from effectq import keys
from effectq.canonical import MAX_DEPTH, canonical_json
from effectq.keys import check_key, default_key, effect_marker, find_markers, has_marker, idempotency_key
from tests.support.probes import ROOT


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: float


class Order(pydantic.BaseModel):
    id: int
    placed: dt.datetime
    tags: set[str] = set()


def test_object_keys_are_sorted_and_whitespace_free() -> None:
    """Two dicts built in different orders give the same bytes."""
    assert (
        canonical_json({"b": 1, "a": [1, 2]}) == canonical_json({"a": [1, 2], "b": 1}) == b'{"a":[1,2],"b":1}'
    )


def test_integral_floats_equal_integers() -> None:
    """1.0 and 1 are the same input; 1.5 stays a float."""
    assert canonical_json(1.0) == canonical_json(1) == b"1"
    assert canonical_json(1.5) == b"1.5"


def test_sets_are_canonicalised() -> None:
    """A set gives the same bytes whatever its iteration order."""
    assert canonical_json({3, 1, 2}) == canonical_json(frozenset([2, 3, 1])) == b"[1,2,3]"
    assert canonical_json({"b", "a"}) == b'["a","b"]'


def test_value_types() -> None:
    """datetime, UUID, Decimal, Enum, bytes, paths, tuples have one canonical form each."""
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    ident = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert canonical_json(when) == b'"2026-01-02T03:04:05+00:00"'
    assert canonical_json(ident) == b'"12345678-1234-5678-1234-567812345678"'
    assert canonical_json(decimal.Decimal("1.10")) == canonical_json(decimal.Decimal("1.1")) == b'"1.1"'
    assert canonical_json(decimal.Decimal("100")) == b'"100"'
    assert canonical_json(Color.RED) == b'"red"'
    assert canonical_json(b"\x00\xff") == b'{"$bytes":"AP8="}'
    assert canonical_json(PurePosixPath("/a/b")) == b'"/a/b"'
    assert canonical_json((1, "x")) == canonical_json([1, "x"])
    assert canonical_json(dt.timedelta(seconds=90)) == b"90"


def test_sets_inside_models_are_canonical_in_every_process() -> None:
    """A set field of a model gives the same bytes whatever the process's hash seed."""
    code = (
        "import datetime as dt, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from tests.unit.test_keys import Order\n"
        "from effectq.canonical import canonical_json\n"
        "o = Order(id=1, placed=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), tags={'b', 'a', 'c', 'd', 'e'})\n"
        "print(canonical_json(o).decode())\n"
    )
    outputs = set()
    for seed in ("1", "2", "3", "4"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        outputs.add(out.stdout)
    assert len(outputs) == 1
    assert '"tags":["a","b","c","d","e"]' in outputs.pop()


def test_dataclasses_and_pydantic_models() -> None:
    """Structured objects are objects of their fields."""
    assert canonical_json(Point(1, 2.0)) == b'{"x":1,"y":2}'
    order = Order(id=1, placed=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), tags={"b", "a"})
    assert canonical_json(order) == canonical_json(
        Order(id=1, placed=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), tags={"a", "b"})
    )


def test_nan_and_infinity_are_refused() -> None:
    """NaN and Infinity are not JSON: a clear error names the argument."""
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(effectq.InvalidInputError, match="amount"):
            canonical_json({"x": bad}, argument="amount")


def test_cycles_are_refused_with_the_path() -> None:
    """A list that contains itself is an error naming where."""
    data: list[Any] = [1]
    data.append(data)
    with pytest.raises(effectq.InvalidInputError, match="cycle") as info:
        canonical_json(data, argument="items")
    assert info.value.argument == "items[1]"


def test_arbitrary_objects_are_refused_never_stringified() -> None:
    """An object with no canonical form is an error, not its str() or repr()."""

    class Session:
        def __repr__(self) -> str:
            return "Session()"

    with pytest.raises(effectq.InvalidInputError, match=r"user\.session.*Session") as info:
        canonical_json({"session": Session()}, argument="user")
    assert info.value.argument == "user.session"


def test_deep_nesting_is_refused() -> None:
    """Input nested deeper than the bound is a clear error, not a RecursionError."""
    data: Any = 0
    for _ in range(MAX_DEPTH + 5):
        data = [data]
    with pytest.raises(effectq.InvalidInputError, match="deeper"):
        canonical_json(data)


def test_huge_input_hashes() -> None:
    """A 10 MB input is keyed (only its hash is kept)."""
    assert len(canonical_json("x" * 10_000_000)) == 10_000_002


def test_mapping_keys_that_collide_are_refused() -> None:
    """{1: ..., "1": ...} would be one JSON key: refused rather than merged."""
    with pytest.raises(effectq.InvalidInputError, match="two keys"):
        canonical_json({1: "a", "1": "b"})


def test_default_key_parses_from_the_right() -> None:
    """Run ids may contain colons; names may not, so the key stays unambiguous."""
    key = default_key("welcome-email:42", "email.send", "ab" * 32)
    run_id, name, digest = key.rsplit(":", 2)
    assert (run_id, name, digest) == ("welcome-email:42", "email.send", "ab" * 32)
    with pytest.raises(effectq.ConfigurationError):
        effectq.effect(name="bad:name")(lambda: None)


@pytest.mark.parametrize("bad", [None, 42, b"bytes", "", "   ", "x" * 2000, "a\nb"])
def test_key_function_results_are_checked(bad: object) -> None:
    """A key function returning a non-string, empty, huge or multi-line key is refused."""
    with pytest.raises(effectq.InvalidKeyError):
        check_key(bad, name="e")


def test_idempotency_key_is_a_stable_uuid() -> None:
    """The same namespace and key give the same UUID; another namespace another one."""
    a = idempotency_key("shop", "run:e:1")
    assert a == idempotency_key("shop", "run:e:1")
    assert a != idempotency_key("other", "run:e:1")
    assert str(uuid.UUID(a)) == a


def test_markers_round_trip() -> None:
    """A marker is a valid HTML comment and gives its key back, even with odd characters."""
    key = "run 1:comment:a--b%c>"
    marker = effect_marker(key)
    assert marker.startswith("<!-- effectq:effect=") and marker.endswith(" -->")
    assert "--" not in marker[4:-3]
    body = f"Thanks!\n\n{marker}\n{effect_marker('other')}"
    assert list(find_markers(body)) == [key, "other"]
    assert has_marker(body, key)
    assert not has_marker("Thanks!", key)


_PIECES = st.lists(st.sampled_from([*"ab:-_.0f9<>[]@+/ \n:é", "0123456789abcdef" * 4]), max_size=8)


@settings(max_examples=400, deadline=None)
@given(
    run_id=_PIECES.map("".join),
    name=_PIECES.map("".join),
    tail=st.one_of(
        st.just("0123456789abcdef" * 4),
        st.text(st.sampled_from("0123456789abcdefA: \n"), min_size=63, max_size=65),
        _PIECES.map("".join),
    ),
)
def test_split_default_key_agrees_with_the_pattern(run_id: str, name: str, tail: str) -> None:
    """The fast split answers exactly as the default-key pattern: where a record lives depends on it."""
    key = f"{run_id}:{name}:{tail}"
    match = keys._DEFAULT_KEY.fullmatch(key)
    expected = None if match is None else match.groups()
    assert keys.split_default_key(key) == expected
    alone = keys._DEFAULT_KEY.fullmatch(tail)
    assert keys.split_default_key(tail) == (None if alone is None else alone.groups())


@pytest.mark.parametrize(
    "tail",
    [
        "0123456789abcdef" * 4,
        "0123456789ABCDEF" * 4,  # capitals: hex, but no hexdigest's
        "ab" * 31 + "aB",
        "ab" * 30 + " ab ",  # spaces between or around the digits
        "ab" * 31 + "\tb",
        "ab" * 31 + "a\u0663",  # a digit, not an ASCII one
        "ab" * 31 + "ag",
        "ab" * 31 + "0x",
        "ab" * 31 + "a_",
        "ab" * 31 + "a",  # 63
        "ab" * 32 + "a",  # 65
    ],
)
def test_a_default_keys_hash_is_64_lowercase_hex_digits(tail: str) -> None:
    """Tails a random one rarely draws: only 64 lowercase ASCII hex digits make a default key."""
    key = f"run:name:{tail}"
    match = keys._DEFAULT_KEY.fullmatch(key)
    assert keys.split_default_key(key) == (None if match is None else match.groups())


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300))
def test_the_sha256_keys_use_is_hashlibs(data: bytes) -> None:
    """Keys and record digests hash with CPython's own SHA-256 where there is one: the same digests."""
    assert keys.sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
    assert keys.sha256(data).digest() == hashlib.sha256(data).digest()


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(tree=_JSON)
def test_the_encoder_made_once_writes_what_json_writes(tree: Any) -> None:
    """Keys must not change with how the JSON is written: the same bytes as JSONEncoder.encode."""
    from effectq import canonical_text

    assert canonical_text.tree_text(tree) == canonical_text.ENCODER.encode(tree)


_ID_CHARS = st.sampled_from(
    [*"a:-_ 0é", *"\x00\n\t\x1f\x7f", *"\x80\x85\x9f\xa0\u2028\u200b\ufeff\ud800\U0001f600\U000e0001"]
)
"""Printable, ASCII controls, and unprintable characters that are no ASCII control."""


@settings(max_examples=500, deadline=None)
@given(text=st.lists(_ID_CHARS, max_size=6).map("".join) | st.text(max_size=12))
def test_run_ids_and_keys_refuse_exactly_ascii_control_characters(text: str) -> None:
    """A run id or a key function's key is refused for C0 controls and DEL, and only for them among
    its characters (other unprintable ones, line separators, zero-width or lone surrogates pass)."""
    control = any(ord(c) < 0x20 or ord(c) == 0x7F for c in text)
    for check, error in (
        (keys.check_run_id, effectq.ConfigurationError),
        (lambda t: check_key(t, name="e"), effectq.InvalidKeyError),
    ):
        refused = not text or control or (check is not keys.check_run_id and not text.strip())
        if refused:
            with pytest.raises(error):
                check(text)
        else:
            assert check(text) == text


def test_run_ids_and_keys_are_at_most_max_key_length() -> None:
    """1,024 characters pass, one more is refused, printable or not."""
    for fill in ("x", "\x85"):
        assert keys.check_run_id(fill * keys.MAX_KEY_LENGTH) == fill * keys.MAX_KEY_LENGTH
        with pytest.raises(effectq.ConfigurationError):
            keys.check_run_id(fill * (keys.MAX_KEY_LENGTH + 1))
        with pytest.raises(effectq.InvalidKeyError):
            check_key("k" + fill * keys.MAX_KEY_LENGTH, name="e")
