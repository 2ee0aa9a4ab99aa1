"""An exception raised from a signal handler, at each point one can land, loses no connection.

A worker's time limit (Celery's soft time limit, Dramatiq's ``TimeLimitExceeded``, a
``SIGALRM`` handler of one's own) raises from a signal handler. CPython runs the handler
only where it checks for pending signals: as a function starts, after a call returns,
and at a loop's backward jump. ``test_signal_storm`` fires at random times; this test
lands the exception at each such point of effectq's code in turn, deterministically, by
raising it from a trace function, and asserts the store's connections all come back.
"""

from __future__ import annotations

import dis
import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import redis
from billiard.exceptions import SoftTimeLimitExceeded

import effectq
from effectq.store.base import ClaimRequest, ResultState
from effectq.store.redis.wire.sync import flush_pending

PACKAGE = str(Path(effectq.__file__).parent)


class Landed(Exception):
    """The point was reached, and the exception raised there."""


@cache
def _checked_offsets(code: CodeType) -> frozenset[int]:
    """Where CPython looks for a pending signal in ``code`` (besides its start): the instruction
    after each call, and each backward jump."""
    points: set[int] = set()
    after_call = False
    for instruction in dis.get_instructions(code):
        if after_call:
            points.add(instruction.offset)
        after_call = instruction.opname.startswith("CALL")
        if instruction.opname.startswith("JUMP_BACKWARD") and "NO_INTERRUPT" not in instruction.opname:
            points.add(instruction.offset)
    return frozenset(points)


class Points:
    """Counts the points a signal's exception can land at in effectq's frames; raises ``raised``
    at point number ``at`` (None: only counts).

    After a call to a Python function returns, CPython does not look (it looked as that
    function started): an instruction after a call is a point only when the call was to
    C code, as no Python frame returned into it just before."""

    def __init__(self, at: int | None, raised: Callable[[], BaseException]) -> None:
        self.at, self.raised, self.seen = at, raised, 0
        self.returned_to: FrameType | None = None

    def _reached(self) -> None:
        self.seen += 1
        if self.seen == self.at:
            sys.settrace(None)
            raise self.raised()

    def start(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        if not frame.f_code.co_filename.startswith(PACKAGE):
            return self.other
        frame.f_trace_opcodes = True
        self._reached()  # the function's start
        return self.step

    def other(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            self.returned_to = frame.f_back
        return self.other

    def step(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            self.returned_to = frame.f_back
        elif event == "opcode":
            after_python = self.returned_to is frame
            self.returned_to = None
            if not after_python and frame.f_lasti in _checked_offsets(frame.f_code):
                self._reached()
        return self.step


@contextmanager
def landing(points: Points) -> Iterator[None]:
    """Trace the calls inside, with the cyclic collector off: a store of an earlier round, left to
    it, would otherwise be collected in there and its finalizer's frames counted as the calls'
    (an exception raised in a finalizer is only printed, "Exception ignored in")."""
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    sys.settrace(points.start)
    try:
        yield
    finally:
        sys.settrace(None)
        if collecting:
            gc.enable()


def _calls(store: effectq.RedisStore, key: str, n: int) -> None:
    """What an effect's run asks of the store: a claim, a read, a pipelined completion, the
    run's end reading its reply."""
    claim = store.claim(key, ClaimRequest(lease_ms=60_000, owner=f"h:1:{n}", name="points", run_id="r"))
    store.get(key)
    if claim.token:
        store.complete_pipelined(
            key,
            claim.token,
            lambda outcome: None,
            result=b"x",
            result_state=ResultState.STORED,
            retention_ms=60_000,
        )
    flush_pending()


RAISED: dict[str, Callable[[], BaseException]] = {
    "soft time limit": SoftTimeLimitExceeded,  # an Exception: Celery's
    "base exception": KeyboardInterrupt,  # a BaseException, as Dramatiq's time limit is
}


@pytest.mark.parametrize(
    ("raised", "options"),
    [("soft time limit", {}), ("base exception", {}), ("base exception", {"poll_replies": 1e-6})],
    ids=["soft time limit", "base exception", "base exception, polling for replies"],
)
def test_an_interrupt_at_any_point_of_a_call_loses_no_connection(
    redis_url: str, namespace: str, raised: str, options: dict[str, Any]
) -> None:
    """On a pool of ONE connection, the calls an effect makes are interrupted at each point in turn
    (the first call takes the connection from the pool, later ones reuse it): after each, the
    same calls run again without running out of connections, and once the store is closed the
    pool hands its one connection out again. A store that polls for its replies too (a budget
    of 1 µs: one poll per reply, so that every pass meets the same points): an interrupt in the
    polling leaves the connection as one in the read does."""
    counted = Points(None, RAISED[raised])
    client = redis.Redis.from_url(redis_url, max_connections=1)
    store = effectq.RedisStore(client, namespace=namespace, **options)
    with landing(counted):
        _calls(store, "k-0", 0)
        _calls(store, "k-0", 1)
    store.close()
    client.close()
    assert counted.seen > 100, counted.seen  # the tracer sees effectq's frames

    landed = 0
    for at in range(1, counted.seen + 1):
        client = redis.Redis.from_url(redis_url, max_connections=1)
        store = effectq.RedisStore(client, namespace=namespace, **options)
        key = f"k-{at}"
        try:
            with landing(Points(at, RAISED[raised])):
                _calls(store, key, 0)
                _calls(store, key, 1)
        except BaseException as exc:  # raised as is, or wrapped in a StoreError, or settled late
            landed += 1
            del exc
        try:
            _calls(store, key, 2)
            _calls(store, key + "-again", 3)
        except Exception as exc:
            pytest.fail(f"interrupted at point {at} of {counted.seen}: the calls after failed: {exc!r}")
        store.close()
        client.connection_pool.get_connection()  # the pool's one connection is back
        client.close()
    assert landed > counted.seen // 2, (landed, counted.seen)
