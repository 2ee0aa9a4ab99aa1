"""The default key's canonical JSON is RFC 8785 (JCS): another language's service computes the same key.

Checked against the RFC's own examples (section 3.2, Appendix B) and against the
``rfc8785`` package, a JCS implementation of its own, on generated input.
"""

from __future__ import annotations

import hashlib
import math
import struct
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

import effectq
from effectq.canonical import canonical_json, number_text
from effectq.errors import InvalidInputError

# RFC 8785, Appendix B: IEEE 754 bit patterns and their JCS text.
APPENDIX_B = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def double(bits: str) -> float:
    value: float = struct.unpack(">d", bytes.fromhex(bits))[0]
    return value


@pytest.mark.parametrize(("bits", "text"), APPENDIX_B)
def test_appendix_b_numbers(bits: str, text: str) -> None:
    """Every number of Appendix B, alone, in a list and as an object's member."""
    value = double(bits)
    assert canonical_json(value) == text.encode()
    assert canonical_json([value]) == f"[{text}]".encode()
    assert canonical_json({"n": value}) == f'{{"n":{text}}}'.encode()
    assert number_text(value) == text


@pytest.mark.parametrize("bits", ["7fffffffffffffff", "7ff0000000000000", "fff0000000000000"])
def test_nan_and_infinity_are_refused(bits: str) -> None:
    with pytest.raises(InvalidInputError, match="not valid JSON"):
        canonical_json({"n": double(bits)})


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e16, "10000000000000000"),
        (1e-7, "1e-7"),
        (1e-6, "0.000001"),
        (1e-5, "0.00001"),
        (2.0**53, "9007199254740992"),
        (1.23e20, "123000000000000000000"),
        (1e21, "1e+21"),
        (0.1, "0.1"),
        (-0.0, "0"),
        (0.0001, "0.0001"),
        (1.5, "1.5"),
    ],
)
def test_numbers_python_writes_otherwise(value: float, text: str) -> None:
    """The floats the issue named, where Python's text (1e+16, 1e-07, 9007199254740992.0) is not JCS."""
    assert canonical_json(value) == text.encode() == rfc8785.dumps(value)


def test_the_sample_of_section_3_2_2() -> None:
    """RFC 8785, section 3.2.2: numbers, escapes and literals of the sample object."""
    value = {
        "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
        "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
        "literals": [None, True, False],
    }
    expected = (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    assert canonical_json(value) == expected.encode("utf-8")


def test_members_sort_by_utf16_code_units() -> None:
    """RFC 8785, section 3.2.3: U+1F600 (surrogates D83D DE00) sorts before U+FB33."""
    names = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
    value = {name: i for i, name in enumerate(reversed(names))}
    members = ",".join(f'"{name}":{len(names) - 1 - i}' for i, name in enumerate(names))
    text = "{" + members.replace("\r", "\\r") + "}"
    assert canonical_json(value) == text.encode("utf-8") == rfc8785.dumps(value)


def test_only_quote_backslash_and_controls_are_escaped() -> None:
    value = '\x00\x1f\x08\t\n\x0c\r"\\/\u2028\x7f<>&é'
    assert canonical_json(value) == b'"\\u0000\\u001f\\b\\t\\n\\f\\r\\"\\\\/' + '\u2028\x7f<>&é"'.encode()


@pytest.mark.parametrize(
    "value",
    [
        "a\ud800",
        ["ok", {"name": "\udc00"}],
        {"\ud83d": 1},
    ],
)
def test_a_lone_surrogate_is_invalid_input(value: Any) -> None:
    """Not a bare UnicodeEncodeError: the documented InvalidInputError, naming where it is."""
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        canonical_json(value, argument="body")


@pytest.mark.parametrize("n", [0, 1, -1, 2**53 - 1, 2**53, -(2**53), 10**16, 123 * 10**18, 10**20])
def test_an_integral_float_is_its_integer(n: int) -> None:
    """1.0 and 1 are one input, above 2**53 too (2.0**53, 1e16, 1.23e20)."""
    assert float(n) == n
    assert canonical_json(float(n)) == canonical_json(n) == str(n).encode()


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=-(2**53), max_value=2**53))
def test_integral_floats_are_integers_within_2_53(n: int) -> None:
    assert canonical_json(float(n)) == canonical_json(n) == rfc8785.dumps(float(n))


def test_large_integers_keep_every_digit() -> None:
    """RFC 8785 has doubles only; two ids a double cannot tell apart stay two inputs."""
    assert canonical_json(2**64 + 1) == b"18446744073709551617"
    assert canonical_json(2**64 + 1) != canonical_json(2**64)


_SAFE_INTS = st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
_JCS = st.recursive(
    st.none() | st.booleans() | _SAFE_INTS | _FLOATS | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=1500, deadline=None)
@given(tree=_JCS)
def test_the_same_bytes_as_the_rfc8785_package(tree: Any) -> None:
    assert canonical_json(tree) == rfc8785.dumps(tree)


@settings(max_examples=1500, deadline=None)
@given(bits=st.integers(min_value=0, max_value=2**64 - 1))
def test_every_double_as_the_rfc8785_package_writes_it(bits: int) -> None:
    value: float = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
    if not math.isfinite(value):
        return
    assert canonical_json(value) == rfc8785.dumps(value)


def test_the_default_key_is_what_a_jcs_service_computes(redis_client: Any, namespace: str) -> None:
    """A TypeScript service keys ``run:tool:sha256(JCS of the input object)``: the same key."""
    store = effectq.RedisStore(redis_client, namespace=namespace)

    @effectq.effect(name="comment")
    def comment(issue: int, body: str, score: float, tags: dict[str, Any]) -> str:
        return body

    tags = {"\ufb33": 1, "\U0001f600": 2.0}
    arguments = {"issue": 42, "body": "h\u00e9llo \U0001f600", "score": 1e-7, "tags": tags}
    expected = f"run-1:comment:{hashlib.sha256(rfc8785.dumps(arguments)).hexdigest()}"
    with effectq.run("run-1", store=store):
        assert comment.key(**arguments) == expected
        assert comment(**arguments) == arguments["body"]
    assert store.get(expected) is not None


def test_a_lone_surrogate_in_a_call_runs_nothing(redis_client: Any, namespace: str) -> None:
    """Through the public API: InvalidInputError naming the argument, before any claim."""
    store = effectq.RedisStore(redis_client, namespace=namespace)
    calls: list[str] = []

    @effectq.effect(name="notify")
    def notify(to: str, lines: list[str]) -> None:
        calls.append(to)

    with effectq.run("run-2", store=store), pytest.raises(InvalidInputError) as caught:
        notify("ann", ["fine", "broken \ud800"])
    assert caught.value.argument == "lines[1]"
    assert "lone surrogate" in str(caught.value)
    assert calls == []
    assert redis_client.keys(f"effectq:{{{namespace}}}*") == []
