"""Redaction: what Redis keeps of a result is what ``redact`` returns, or nothing at all.

Every replay here reads Redis through a store of its own (its own client, its own scripts,
a fresh effect and codec), as another worker would after a redelivery.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import pydantic
import pytest
import redis

import effectq
from effectq.events import EventKind
from effectq.store.base import ClaimRequest, ResultState

SECRET = "4242424242424242"


class Charge(pydantic.BaseModel):
    id: str
    amount: int
    card: str


@dataclasses.dataclass
class Token:
    value: str
    scope: str


def masked(charge: Charge) -> Charge:
    return charge.model_copy(update={"card": "****" + charge.card[-4:]})


@pytest.fixture
def fresh_store(redis_url: str, namespace: str) -> Iterator[Callable[[], effectq.RedisStore]]:
    """New RedisStores on new clients, in the test's namespace: each reads only what Redis holds."""
    made: list[effectq.RedisStore] = []

    def make() -> effectq.RedisStore:
        store = effectq.RedisStore(redis.Redis.from_url(redis_url), namespace=namespace)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()
        store.client.close()


def raw(client: redis.Redis, namespace: str) -> bytes:
    """Every byte Redis holds for the namespace (strings and hashes)."""
    out = b""
    for key in client.scan_iter(match=f"*{namespace}*"):
        kind = client.type(key)
        if kind == b"string":
            out += client.get(key) or b""
        elif kind == b"hash":
            out += b"".join(k + v for k, v in client.hgetall(key).items())
    return out


def charge_effect(calls: list[int], **options: Any) -> effectq.Effect[[int], Charge]:
    @effectq.effect(name="redact.charge", **options)
    def charge(amount: int) -> Charge:
        calls.append(amount)
        return Charge(id="ch_1", amount=amount, card=SECRET)

    return charge


def test_the_first_caller_gets_the_result_a_replay_the_redacted_one(
    fresh_store: Callable[[], effectq.RedisStore], redis_client: redis.Redis, namespace: str
) -> None:
    """The caller that applied gets the card number; Redis never holds it; a replay from another
    store gets the redacted model, of the return type."""
    calls: list[int] = []
    with effectq.run("order-1", store=fresh_store()):
        first = charge_effect(calls, redact=masked).call_with_outcome(500)
    assert (first.value.card, first.kind) == (SECRET, EventKind.EXECUTED)
    held = raw(redis_client, namespace)
    assert b"ch_1" in held
    assert SECRET.encode() not in held
    with effectq.run("order-1", store=fresh_store()):
        again = charge_effect(calls, redact=masked).call_with_outcome(500)
    assert again.kind is EventKind.REPLAYED
    assert again.value == Charge(id="ch_1", amount=500, card="****4242")
    assert calls == [500]


def test_nothing_records_applied_without_a_result(
    fresh_store: Callable[[], effectq.RedisStore], redis_client: redis.Redis, namespace: str
) -> None:
    """redact=NOTHING: the record says applied and withheld, holds no result; a replay returns None
    without running the function, in sync and async effects alike."""
    calls: list[int] = []
    with effectq.run("order-2", store=fresh_store()):
        assert charge_effect(calls, redact=effectq.NOTHING)(7).card == SECRET
    assert b"ch_1" not in raw(redis_client, namespace)
    reader = fresh_store()
    with effectq.run("order-2", store=reader):
        charge = charge_effect(calls, redact=effectq.NOTHING)
        replay = charge.call_with_outcome(7)
        key = charge.key(7)
    assert (replay.value, replay.kind) == (None, EventKind.REPLAYED)
    assert calls == [7]
    record = reader.get(key)
    assert record is not None
    assert (record.status, record.result_state, record.result) == (
        effectq.Status.COMPLETED,
        ResultState.WITHHELD,
        None,
    )

    @effectq.effect(name="redact.token", redact=effectq.NOTHING)
    async def issue(scope: str) -> Token:
        calls.append(0)
        return Token(value="tok_secret", scope=scope)

    async def twice() -> list[Any]:
        out = []
        for _ in range(2):
            async with effectq.run("order-2a", store=fresh_store()):
                out.append(await issue("read"))
        return out

    assert asyncio.run(twice()) == [Token(value="tok_secret", scope="read"), None]
    assert calls == [7, 0]
    assert b"tok_secret" not in raw(redis_client, namespace)


def test_a_redaction_that_breaks_the_type_still_records_applied(
    fresh_store: Callable[[], effectq.RedisStore], caplog: pytest.LogCaptureFixture
) -> None:
    """A redact whose value does not read back as the return type (or that raises) cannot lose the
    application: it is recorded applied without a result, and a replay says so instead of running
    again."""
    calls: list[int] = []

    def broken(charge: Charge) -> Any:
        return {"card": "****"}  # not a Charge

    def raising(charge: Charge) -> Charge:
        raise KeyError("card")

    for run_id, redact in (("order-3", broken), ("order-4", raising)):
        with effectq.run(run_id, store=fresh_store()):
            assert charge_effect(calls, redact=redact)(9).card == SECRET
        assert "redact gave what does not record as the return type" in caplog.text
        with effectq.run(run_id, store=fresh_store()), pytest.raises(effectq.ResultNotRecordedError):
            charge_effect(calls, redact=redact)(9)
    assert calls == [9, 9]


def test_a_reconciled_result_is_redacted_too(fresh_store: Callable[[], effectq.RedisStore]) -> None:
    """What a reconcile hook finds goes to Redis through the same redaction as a completion."""
    calls: list[int] = []
    found = Charge(id="ch_9", amount=3, card=SECRET)
    store = fresh_store()
    charge = charge_effect(calls, redact=masked, reconcile=lambda key, args, ctx: found)
    with effectq.run("order-5", store=store):
        key = charge.key(3)
    claim = store.claim(key, ClaimRequest(lease_ms=10_000, owner="crashed"))
    store.mark_unknown(key, claim.token, error="the worker died mid-call")
    with effectq.run("order-5", store=store):
        reconciled = charge.call_with_outcome(3)
    assert (reconciled.value.card, reconciled.kind) == (SECRET, EventKind.RECONCILED)
    with effectq.run("order-5", store=fresh_store()):
        assert charge_effect(calls, redact=masked)(3).card == "****4242"
    assert calls == []


def test_redact_must_be_a_function_or_nothing() -> None:
    """A redact option that is neither is refused when the effect is declared."""
    with pytest.raises(effectq.ConfigurationError, match="redact must be a function"):
        effectq.effect(redact="card")  # type: ignore[arg-type]
