"""A claim, a dispatch or a resolve whose reply is lost, and a re-run that changes hands.

The losses are real where they can be: a relay to the real Redis loses the
reply of a chosen script (:mod:`tests.support.lossy`), the client times out and tries
again. The memory store gets the same scenarios through a wrapper whose call
lands, then fails as a lost reply would (after its clock moved on, for a stall).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

import effectq
from effectq import admin
from effectq.errors import InputMismatchError, ResolveRefusedError, StoreError
from effectq.store.base import Status
from tests.conftest import delete_namespace
from tests.support.lossy import LossyProxy, script_sha
from tests.support.servers import wait_until

LEASE = 1.0
"""The lease of the effects whose claim reply is lost (seconds)."""


class _Clock:
    """Milliseconds: the real time plus however far a test moved it."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset


class _LosingReplies:
    """A store whose next ``times`` calls of ``primitive`` land, then fail as a lost reply would,
    after the clock moved on by ``stall_ms``; everything else goes to ``inner``."""

    def __init__(self, inner: effectq.MemoryStore, primitive: str, times: int, clock: _Clock, stall_ms: int):
        self.inner, self.primitive, self.times = inner, primitive, times
        self.clock, self.stall_ms = clock, stall_ms
        self.lost = 0

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if name != self.primitive:
            return found

        def losing(*args: Any, **kwargs: Any) -> Any:
            reply = found(*args, **kwargs)
            if self.lost < self.times:
                self.lost += 1
                self.clock.offset += self.stall_ms
                raise StoreError(f"injected: the reply of {name} was lost")
            return reply

        return losing


@dataclass
class Losing:
    """A store that loses replies of one primitive, and the same records reached without loss."""

    store: Any
    plain: effectq.Store
    lost: Callable[[], int]


LoseReplies = Callable[..., Losing]


@pytest.fixture(params=["redis", "memory"])
def lose_replies(request: pytest.FixtureRequest) -> Iterator[LoseReplies]:
    """``lose_replies(primitive, times=1, stall=0.5)``: a store whose next ``times`` calls of
    ``primitive`` land and whose replies are lost, the caller giving up after ``stall`` seconds."""
    closing: list[Callable[[], None]] = []

    def on_redis(primitive: str, times: int = 1, stall: float = 0.5) -> Losing:
        url, namespace = request.getfixturevalue("redis_url"), request.getfixturevalue("namespace")
        proxy, through = LossyProxy.for_url(url)
        plain_client = redis.Redis.from_url(url)
        proxy.lose_reply_to(script_sha(plain_client, primitive), times)
        store = effectq.RedisStore(redis.Redis.from_url(through, socket_timeout=stall), namespace=namespace)
        plain = effectq.RedisStore(plain_client, namespace=namespace)
        closing.extend((store.close, plain.close, store.client.close, proxy.close))
        closing.append(lambda: (delete_namespace(plain_client, namespace), plain_client.close()))
        return Losing(store, plain, lambda: proxy.lost)

    def in_memory(primitive: str, times: int = 1, stall: float = 0.0) -> Losing:
        clock = _Clock()
        plain = effectq.MemoryStore(clock=clock)
        store = _LosingReplies(plain, primitive, times, clock, int(stall * 1000))
        return Losing(store, plain, lambda: store.lost)

    yield on_redis if request.param == "redis" else in_memory
    for close in closing:
        close()


def _call(store: Any, fn: Callable[..., Any], *args: Any, run_id: str = "") -> Any:
    with effectq.run(run_id or f"run-{uuid.uuid4().hex[:8]}", store=store):
        return fn(*args)


# -- a retried claim takes a fresh lease ------------------------------------------------------


def test_a_claim_retried_after_its_lease_ran_out_runs_once(lose_replies: LoseReplies) -> None:
    """Worker A's first claim lands, its reply is lost and A gives up after more than the lease;
    its retry (the same owner) gets the grant back with a lease from the retry. Worker B, whose
    reconcile hook finds nothing, calls the same effect while A runs: it sees it in flight and
    gets A's result. One execution."""
    losing = lose_replies("claim", stall=LEASE + 0.3)
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
            outcomes["A"] = _call(losing.store, ship, 1)
        except BaseException as exc:  # reported by the assertions below
            outcomes["A"] = exc
            a_running.set()

    thread = threading.Thread(target=worker_a, name="A")
    thread.start()
    try:
        assert a_running.wait(30.0), "worker A never ran"
        assert losing.lost() == 1, "the first claim's reply was not lost"
        try:
            outcomes["B"] = _call(losing.plain, ship, 1)
        except Exception as exc:
            outcomes["B"] = exc
    finally:
        b_done.set()
        thread.join(30.0)
    assert executed == ["A"], outcomes
    assert outcomes == {"A": "shipped by A", "B": "shipped by A"}


# -- a lost dispatch reply ------------------------------------------------------------------


def _after_an_unknown(name: str, runs: list[int], **options: Any) -> Any:
    """An effect whose first attempt times out (unknown) and whose reconcile hook finds nothing."""

    @effectq.effect(
        name=name, key=lambda args, ctx: "parcel-3", reconcile=lambda key, args, ctx: None, **options
    )
    def send(n: int) -> int:
        runs.append(n)
        if len(runs) == 1:
            raise TimeoutError("the carrier did not answer")
        return n

    return send


def test_a_dispatch_whose_reply_was_lost_is_retried_and_runs_once(lose_replies: LoseReplies) -> None:
    """After a reconcile that found nothing, the dispatch lands but its reply is lost: the retry
    (the same token) gets the dispatch back, and the function runs, once."""
    losing = lose_replies("dispatch")
    runs: list[int] = []
    send = _after_an_unknown("edge.send", runs)
    with pytest.raises(TimeoutError):
        _call(losing.store, send, 1)
    assert _call(losing.store, send, 2) == 2
    assert losing.lost() == 1
    assert runs == [1, 2]
    record = losing.plain.get("parcel-3")
    assert record is not None and record.status is Status.COMPLETED


def test_an_async_dispatch_whose_reply_was_lost_is_retried_and_runs_once(lose_replies: LoseReplies) -> None:
    """The same for an async effect."""
    losing = lose_replies("dispatch")
    runs: list[int] = []

    @effectq.effect(name="edge.send_async", key=lambda args, ctx: "parcel-4", reconcile=lambda k, a, c: None)
    async def send(n: int) -> int:
        runs.append(n)
        if len(runs) == 1:
            raise TimeoutError("the carrier did not answer")
        return n

    async def call(n: int) -> int:
        async with effectq.run(f"run-{uuid.uuid4().hex[:8]}", store=losing.store):
            return await send(n)

    with pytest.raises(TimeoutError):
        asyncio.run(call(1))
    assert asyncio.run(call(2)) == 2
    assert (losing.lost(), runs) == (1, [1, 2])


def test_a_dispatch_that_never_answers_is_given_back(lose_replies: LoseReplies) -> None:
    """Every try of the dispatch lands and loses its reply: the caller gets the store's error,
    and the dispatch is given back (nothing ran under it), so the next call runs the effect
    instead of meeting a dispatched record nobody runs."""
    losing = lose_replies("dispatch", times=3)
    runs: list[int] = []
    send = _after_an_unknown("edge.send_lost", runs)
    with pytest.raises(TimeoutError):
        _call(losing.store, send, 1)
    with pytest.raises(StoreError):
        _call(losing.store, send, 2)
    assert losing.lost() == 3
    assert runs == [1]
    wait_until(
        lambda: (record := losing.plain.get("parcel-3")) is not None and record.status is Status.RELEASED,
        "the dispatch given back",
        timeout=30.0,
    )
    assert _call(losing.plain, send, 3) == 3
    assert runs == [1, 3]


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


# -- resolve, retried -------------------------------------------------------------------------


def _unknown(store: Any, key: str) -> None:
    @effectq.effect(name="edge.refund", key=lambda args, ctx: key)
    def refund(n: int) -> int:
        raise TimeoutError("the bank did not answer")

    with pytest.raises(TimeoutError):
        _call(store, refund, 1)


@pytest.mark.parametrize("applied", [True, False])
def test_a_resolve_resent_by_redis_py_after_a_lost_reply_reports_the_settlement(
    redis_url: str, redis_store: effectq.RedisStore, applied: bool
) -> None:
    """The resolve lands, its reply is lost, and redis-py's own retry (a client the store sends
    through redis-py: a blocking pool here, or a cluster) sends it again: the operator is told
    the record is settled as asked, not that it was refused."""
    _unknown(redis_store, "refund-9")
    proxy, through = LossyProxy.for_url(redis_url)
    proxy.lose_reply_to(script_sha(redis_store.client, "resolve"))
    retry = Retry(ExponentialBackoff(cap=0.1), 3)  # a timeout is retried, as a user may configure
    pool = redis.BlockingConnectionPool.from_url(through, socket_timeout=0.5, retry=retry)
    store = effectq.RedisStore(redis.Redis(connection_pool=pool), namespace=redis_store.namespace)
    try:
        result = '"refunded"' if applied else None
        before, after = admin.resolve(store, "refund-9", applied=applied, result=result, note="ops: checked")
    finally:
        store.close()
        pool.disconnect()
        proxy.close()
    assert proxy.lost == 1
    assert before is not None and before.status is Status.UNKNOWN
    assert after.status is (Status.COMPLETED if applied else Status.RELEASED)
    assert "ops: checked" in after.error


def test_a_resolve_repeated_with_the_same_decision_succeeds(store: effectq.Store) -> None:
    """Resolving a record again exactly as it was resolved (the same outcome, result and note)
    reports the settlement; another decision is refused, as before."""
    _unknown(store, "refund-10")
    first = admin.resolve(store, "refund-10", applied=True, result='"refunded"', note="ops: checked")[1]
    again = admin.resolve(store, "refund-10", applied=True, result='"refunded"', note="ops: checked")[1]
    assert (again.status, again.token, again.result) == (Status.COMPLETED, first.token, first.result)
    for other in (
        {"applied": True, "result": '"other"', "note": "ops: checked"},
        {"applied": True, "result": '"refunded"', "note": "someone else"},
        {"applied": False, "note": "ops: checked"},
    ):
        with pytest.raises(ResolveRefusedError):
            admin.resolve(store, "refund-10", **other)  # type: ignore[arg-type]
    _unknown(store, "refund-11")
    first = admin.resolve(store, "refund-11", applied=False, note="ops: never sent")[1]
    again = admin.resolve(store, "refund-11", applied=False, note="ops: never sent")[1]
    assert (again.status, again.token) == (Status.RELEASED, first.token)
    with pytest.raises(ResolveRefusedError):
        admin.resolve(store, "refund-11", applied=True, note="ops: never sent")
