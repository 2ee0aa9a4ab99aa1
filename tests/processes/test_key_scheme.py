"""The key scheme across an upgrade: records made under the legacy scheme's keys are found under RFC 8785.

The two schemes write the same bytes for nearly every input; for the few they do not
(a float below 1e-4 or from 2**53 up, a member name beyond U+FFFF) a call looks for a
record under the other scheme's key and joins it. Against a real Redis; the crash is
a real process, SIGKILLed.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

import effectq
from effectq import keys
from effectq.canonical import canonical_arguments, key_bytes
from effectq.errors import ConfigurationError, InputMismatchError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _scheme_back() -> Iterator[None]:
    yield
    keys.set_key_scheme(None)


def key_of(run_id: str, name: str, arguments: dict[str, Any], *, legacy: bool) -> str:
    data = canonical_arguments(arguments, legacy=legacy)
    return keys.default_key(run_id, name, hashlib.sha256(data).hexdigest())


@pytest.mark.parametrize(
    ("value", "legacy", "rfc"),
    [
        (1e-7, b"1e-07", b"1e-7"),
        (1e-5, b"1e-05", b"0.00001"),
        (1e16, b"1e+16", b"10000000000000000"),
        (2.0**53, b"9007199254740992.0", b"9007199254740992"),
        (1.23e20, b"1.23e+20", b"123000000000000000000"),
    ],
)
def test_the_legacy_scheme_keeps_the_old_bytes(value: float, legacy: bytes, rfc: bytes) -> None:
    arguments = {"v": value}
    assert canonical_arguments(arguments, legacy=True) == b'{"v":' + legacy + b"}"
    assert key_bytes(arguments) == (b'{"v":' + rfc + b"}", b'{"v":' + legacy + b"}")
    assert key_bytes(arguments, legacy=True) == (b'{"v":' + legacy + b"}", b'{"v":' + rfc + b"}")


def test_the_legacy_scheme_sorts_names_by_code_point() -> None:
    arguments = {"labels": {"\ufb33": 1, "\U0001f600": 2}}
    assert canonical_arguments(arguments, legacy=True).decode() == '{"labels":{"\ufb33":1,"\U0001f600":2}}'
    assert canonical_arguments(arguments).decode() == '{"labels":{"\U0001f600":2,"\ufb33":1}}'


@pytest.mark.parametrize(
    "arguments",
    [
        {"v": 1.5e-10},
        {"v": 5e-324},
        {"v": 1e21},
        {"v": -1.5e300},
        {"v": 0.0001},
        {"labels": {"\U0001f600": 1, "ok": 2}},  # an emoji, but no name the two orders put otherwise
    ],
)
def test_floats_and_names_python_already_writes_as_rfc8785_need_no_bridge(arguments: dict[str, Any]) -> None:
    rfc, other = key_bytes(arguments)
    assert other is None
    assert rfc == canonical_arguments(arguments, legacy=True)


_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)
_TREE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


def _old_tree(node: Any) -> Any:
    """The tree as effectq wrote it before RFC 8785: integral floats below 2**53 as integers."""
    if isinstance(node, float) and node.is_integer() and abs(node) < 2**53:
        return int(node)
    if isinstance(node, dict):
        return {name: _old_tree(item) for name, item in node.items()}
    if isinstance(node, list):
        return [_old_tree(item) for item in node]
    return node


@settings(max_examples=800, deadline=None)
@given(tree=_TREE)
def test_the_schemes_differ_only_where_key_bytes_says(tree: Any) -> None:
    """``key_bytes`` gives the other scheme's bytes exactly when they differ; legacy is the old text."""
    arguments = {"value": tree}
    old = json.dumps(_old_tree(arguments), ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    assert canonical_arguments(arguments, legacy=True) == old.encode("utf-8")
    rfc, legacy = canonical_arguments(arguments), canonical_arguments(arguments, legacy=True)
    assert key_bytes(arguments) == (rfc, None if rfc == legacy else legacy)
    assert key_bytes(arguments, legacy=True) == (legacy, None if rfc == legacy else rfc)


def test_a_key_scheme_is_one_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match=r"'rfc8785' .* or 'legacy'"):
        keys.set_key_scheme("jcs2")
    assert keys.set_key_scheme("LEGACY") is keys.KeyScheme.LEGACY
    monkeypatch.setenv("EFFECTQ_KEY_SCHEME", "legacy")
    assert keys.set_key_scheme(None) is keys.KeyScheme.LEGACY
    monkeypatch.setenv("EFFECTQ_KEY_SCHEME", "rfc8785")
    assert keys.set_key_scheme(None) is keys.KeyScheme.RFC8785
    monkeypatch.delenv("EFFECTQ_KEY_SCHEME")
    assert keys.set_key_scheme(None) is keys.KeyScheme.RFC8785


@pytest.mark.parametrize(("before", "after"), [("legacy", "rfc8785"), ("rfc8785", "legacy")])
def test_a_result_recorded_under_one_scheme_replays_under_the_other(
    redis_client: redis.Redis, namespace: str, before: str, after: str
) -> None:
    """Upgraded (or rolled back) between two deliveries: the effect is not applied again."""
    store = effectq.RedisStore(redis_client, namespace=namespace)
    calls: list[float] = []

    @effectq.effect(name="pay.fee")
    def pay(rate: float, labels: dict[str, int]) -> str:
        calls.append(rate)
        return f"paid-{len(calls)}"

    arguments: dict[str, Any] = {"rate": 1e-7, "labels": {"\U0001f600": 1, "\ufb33": 2}}
    first = key_of("run-1", "pay.fee", arguments, legacy=before == "legacy")
    keys.set_key_scheme(before)
    with effectq.run("run-1", store=store):
        assert pay(**arguments) == "paid-1"
    assert store.get(first) is not None
    keys.set_key_scheme(after)
    with effectq.run("run-1", store=store):
        assert pay.key(**arguments) == first
        assert pay(**arguments) == "paid-1"
    assert calls == [1e-7]
    with effectq.run("run-2", store=store):  # a new run: keys of the scheme in force
        assert pay(**arguments) == "paid-2"
        assert pay.key(**arguments) == key_of("run-2", "pay.fee", arguments, legacy=after == "legacy")


def test_an_input_both_schemes_write_alike_keeps_its_key(redis_client: redis.Redis, namespace: str) -> None:
    store = effectq.RedisStore(redis_client, namespace=namespace)

    @effectq.effect(name="mail.send")
    def send(to: str, amount: float) -> None:
        pass

    arguments = {"to": "ann@example.com", "amount": 19.99}
    with effectq.run("run-1", store=store):
        keys.set_key_scheme("legacy")
        legacy = send.key(**arguments)
        keys.set_key_scheme("rfc8785")
        assert send.key(**arguments) == legacy == key_of("run-1", "mail.send", arguments, legacy=False)


def test_a_key_functions_input_hash_is_bridged_too(redis_client: redis.Redis, namespace: str) -> None:
    """A key function's key stays; its recorded input hash, made under the other scheme, is no mismatch."""
    store = effectq.RedisStore(redis_client, namespace=namespace)
    calls: list[float] = []

    @effectq.effect(name="quote.send", key=lambda args, ctx: f"{ctx.run_id}:quote", on_mismatch="raise")
    def send(price: float) -> str:
        calls.append(price)
        return "sent"

    keys.set_key_scheme("legacy")
    with effectq.run("run-1", store=store):
        send(1e-7)
    keys.set_key_scheme("rfc8785")
    with effectq.run("run-1", store=store):
        assert send(1e-7) == "sent"
        with pytest.raises(InputMismatchError):
            send(2e-7)  # a different input is still told apart
    assert calls == [1e-7]


_CHILD = textwrap.dedent(
    """
    import sys, time
    import redis
    import effectq

    url, namespace, run_id, ledger = sys.argv[1:5]
    client = redis.Redis.from_url(url)
    store = effectq.RedisStore.from_url(url, namespace=namespace)

    @effectq.effect(name="crash.fee", lease=0.5)
    def pay(rate: float) -> str:
        client.rpush(ledger, "applied")
        print("applied", flush=True)
        time.sleep(120)
        return "paid"

    with effectq.run(run_id, store=store):
        pay(1e-7)
    """
)


def test_a_worker_killed_under_the_legacy_scheme_is_not_repeated_after_the_upgrade(
    redis_url: str, redis_client: redis.Redis, namespace: str
) -> None:
    """A worker not yet upgraded applies the effect and is SIGKILLed; the redelivery lands on an
    upgraded worker: it finds the legacy key's record (an unknown outcome), not a fresh key."""
    run_id, ledger = f"crash-{uuid.uuid4().hex[:8]}", f"ledger-{uuid.uuid4().hex[:10]}"
    env = {**os.environ, "EFFECTQ_KEY_SCHEME": "legacy"}
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, redis_url, namespace, run_id, ledger],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "applied"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    try:
        keys.set_key_scheme("rfc8785")
        store = effectq.RedisStore(redis_client, namespace=namespace)
        calls: list[float] = []

        @effectq.effect(name="crash.fee", lease=0.5, wait=5)
        def pay(rate: float) -> str:
            calls.append(rate)
            return "paid again"

        legacy = key_of(run_id, "crash.fee", {"rate": 1e-7}, legacy=True)
        assert legacy != key_of(run_id, "crash.fee", {"rate": 1e-7}, legacy=False)
        deadline = time.monotonic() + 10
        while store.get(legacy) is None and time.monotonic() < deadline:  # the child's claim landed
            time.sleep(0.05)
        with effectq.run(run_id, store=store), pytest.raises(effectq.OutcomeUnknown, match="lease expired"):
            pay(1e-7)
        assert calls == []
        assert redis_client.lrange(ledger, 0, -1) == [b"applied"]
    finally:
        redis_client.delete(ledger)


def test_an_async_effect_is_bridged_alike(redis_client: redis.Redis, namespace: str) -> None:
    import asyncio

    store = effectq.RedisStore(redis_client, namespace=namespace)
    calls: list[float] = []

    @effectq.effect(name="pay.async")
    async def pay(rate: float) -> str:
        calls.append(rate)
        return "paid"

    async def twice() -> None:
        keys.set_key_scheme("legacy")
        with effectq.run("run-1", store=store):
            assert await pay(1e-7) == "paid"
        keys.set_key_scheme("rfc8785")
        with effectq.run("run-1", store=store):
            assert await pay(1e-7) == "paid"

    asyncio.run(twice())
    assert calls == [1e-7]
