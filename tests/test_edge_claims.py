"""A claim, a dispatch or a resolve whose reply is lost, and a re-run that changes hands.

The losses are real where they can be: a relay to the real Redis loses one
reply (:mod:`tests.lossy`), the client times out and tries again. The memory
store gets the same scenarios through a wrapper whose claim lands and then
fails after the store's clock moved past the lease.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

import effectq
from effectq.errors import InputMismatchError, StoreError
from effectq.store.base import ClaimRequest, Status

from .lossy import LossyProxy, script_sha

LEASE = 1.0
"""The lease of the effects whose claim reply is lost (seconds)."""


@pytest.fixture
def lossy(redis_url: str) -> Iterator[LossyProxy]:
    """A relay to the test Redis that can lose a reply, and the URL that goes through it."""
    proxy, _ = LossyProxy.for_url(redis_url)
    yield proxy
    proxy.close()


@pytest.fixture
def proxy_url(lossy: LossyProxy) -> str:
    return f"redis://127.0.0.1:{lossy.port}/0"


class _Clock:
    """Milliseconds: the real time plus however far a test moved it."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset


class _StallingClaims:
    """A store whose first claim lands, then stalls past the lease (the clock moves on) and
    fails as a lost reply would: the caller tries again with the same owner."""

    def __init__(self, inner: effectq.MemoryStore, clock: _Clock, stall_ms: int) -> None:
        self.inner, self.clock, self.stall_ms = inner, clock, stall_ms
        self.lost = 0

    def claim(self, key: str, request: ClaimRequest) -> Any:
        claim = self.inner.claim(key, request)
        if not self.lost:
            self.lost += 1
            self.clock.offset += self.stall_ms
            raise StoreError("injected: the claim's reply was lost after a stall")
        return claim

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _two_workers(a_store: Any, b_store: Any, lost: Callable[[], int]) -> tuple[list[str], dict[str, Any]]:
    """Worker A's first claim lands and its reply is lost past the lease; A's retry gets its grant
    back and A runs. Worker B, with a reconcile hook that finds nothing, calls the same effect
    while A runs. Returns who executed, and what each call returned (or raised)."""
    executed: list[str] = []
    outcomes: dict[str, Any] = {}
    a_running, b_done = threading.Event(), threading.Event()

    @effectq.effect(
        name="edge.ship",
        key=lambda args, ctx: f"shipment-{args['order']}",
        lease=LEASE,
        wait=15.0,
        reconcile=lambda key, args, ctx: None,
    )
    def ship(order: int) -> str:
        worker = "A" if threading.current_thread().name == "A" else "B"
        executed.append(worker)
        if worker == "A":
            a_running.set()
            b_done.wait(4.0)  # A is still running when B calls
        return f"shipped by {worker}"

    def worker_a() -> None:
        try:
            with effectq.run(f"run-a-{uuid.uuid4().hex[:6]}", store=a_store):
                outcomes["A"] = ship(1)
        except BaseException as exc:  # reported by the assertions below
            outcomes["A"] = exc
            a_running.set()

    thread = threading.Thread(target=worker_a, name="A")
    thread.start()
    try:
        assert a_running.wait(30.0), "worker A never ran"
        assert lost() == 1, "the first claim's reply was not lost"
        try:
            with effectq.run(f"run-b-{uuid.uuid4().hex[:6]}", store=b_store):
                outcomes["B"] = ship(1)
        except Exception as exc:
            outcomes["B"] = exc
    finally:
        b_done.set()
        thread.join(30.0)
    return executed, outcomes


# -- a retried claim takes a fresh lease ------------------------------------------------------


def test_a_claim_retried_after_its_lease_ran_out_runs_once_on_redis(
    lossy: LossyProxy, proxy_url: str, redis_url: str, redis_client: redis.Redis, namespace: str
) -> None:
    """The first claim lands, its reply is lost and the client gives up after more than the
    lease; the retry (same owner) gets the grant back with a lease from the retry, so a second
    worker arriving while A runs sees it in flight and gets A's result: one execution."""
    lossy.lose_reply_to(script_sha(redis_client, "claim"))
    a_client = redis.Redis.from_url(proxy_url, socket_timeout=LEASE + 0.3)
    a_store = effectq.RedisStore(a_client, namespace=namespace)
    b_store = effectq.RedisStore(redis.Redis.from_url(redis_url), namespace=namespace)
    try:
        executed, outcomes = _two_workers(a_store, b_store, lambda: lossy.lost)
    finally:
        a_store.close()
        b_store.close()
        a_client.close()
        b_store.client.close()
    assert executed == ["A"], outcomes
    assert outcomes == {"A": "shipped by A", "B": "shipped by A"}


def test_a_claim_retried_after_its_lease_ran_out_runs_once_in_memory() -> None:
    """The same on the memory store: the retried claim's lease runs from the retry."""
    clock = _Clock()
    inner = effectq.MemoryStore(clock=clock)
    a_store = _StallingClaims(inner, clock, stall_ms=int(LEASE * 1000) + 300)
    executed, outcomes = _two_workers(a_store, inner, lambda: a_store.lost)
    assert executed == ["A"], outcomes
    assert outcomes == {"A": "shipped by A", "B": "shipped by A"}


# -- the attempt that executes owns the record's identity -------------------------------------


def _pay_effect(name: str, charges: list[int], **options: Any) -> Any:
    """An effect charging an invoice (the key names the invoice, not the amount): its first
    attempt times out (maybe applied), the later ones charge."""

    @effectq.effect(name=name, key=lambda args, ctx: "invoice-7", on_mismatch="raise", **options)
    def pay(amount: int) -> str:
        charges.append(amount)
        if len(charges) == 1:
            raise TimeoutError("the gateway did not answer")
        return f"charged {amount}"

    return pay


def _call(store: effectq.Store, fn: Callable[..., Any], *args: Any, run_id: str = "") -> Any:
    with effectq.run(run_id or f"run-{uuid.uuid4().hex[:8]}", store=store):
        return fn(*args)


@pytest.mark.parametrize("how", ["replay_safe", "reconcile"])
def test_the_attempt_that_re_runs_an_unknown_owns_its_record(store: effectq.Store, how: str) -> None:
    """pay(100) times out (unknown); pay(250) re-runs it, replay-safe or after a reconcile that
    found nothing. The record is pay(250)'s: pay(250) replays "charged 250", and pay(100) is told
    its input differs, as any caller whose input differs from the recorded one is."""
    charges: list[int] = []
    options: dict[str, Any] = (
        {"replay_safe": True} if how == "replay_safe" else {"reconcile": lambda key, args, ctx: None}
    )
    pay = _pay_effect(f"edge.pay_{how}", charges, **options)
    with pytest.raises(TimeoutError):
        _call(store, pay, 100)
    assert _call(store, pay, 250, run_id="the-re-run") == "charged 250"
    assert _call(store, pay, 250) == "charged 250"
    with pytest.raises(InputMismatchError):
        _call(store, pay, 100)
    assert charges == [100, 250]
    record = store.get("invoice-7")
    assert record is not None and record.status is Status.COMPLETED
    assert record.run_id == "the-re-run"


@pytest.mark.parametrize("on_mismatch", ["raise", "warn"])
def test_a_reconcile_that_finds_the_first_attempt_keeps_its_identity(
    store: effectq.Store, on_mismatch: str, caplog: pytest.LogCaptureFixture
) -> None:
    """pay(100) times out; pay(250)'s reconcile finds pay(100)'s charge. The record is pay(100)'s
    (a later pay(100) replays it), and pay(250) gets what a caller whose input differs from the
    recorded one gets: InputMismatchError, or the recorded result and a warning."""
    charges: list[int] = []
    asked: list[dict[str, Any]] = []

    def found(key: str, args: dict[str, Any], ctx: Any) -> str:
        asked.append(dict(args))
        return "charged 100"

    @effectq.effect(
        name="edge.pay_found", key=lambda args, ctx: "invoice-8", reconcile=found, on_mismatch=on_mismatch
    )
    def pay(amount: int) -> str:
        charges.append(amount)
        raise TimeoutError("the gateway did not answer")

    with pytest.raises(TimeoutError):
        _call(store, pay, 100, run_id="the-first-run")
    if on_mismatch == "raise":
        with pytest.raises(InputMismatchError):
            _call(store, pay, 250)
    else:
        with caplog.at_level(logging.WARNING, logger="effectq.replay"):
            assert _call(store, pay, 250) == "charged 100"
        assert "different input" in caplog.text
    assert asked == [{"amount": 250}]  # the hook is asked with the caller's input
    assert _call(store, pay, 100) == "charged 100"
    assert charges == [100]
    record = store.get("invoice-8")
    assert record is not None and record.status is Status.COMPLETED
    assert record.run_id == "the-first-run"
