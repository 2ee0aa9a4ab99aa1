"""The heartbeat's retried writes at their edges: refused by the store, and spread out in time.

A write the heartbeat retries (a completion, a release, a mark_unknown that
failed on the store after the function ran) can find the record taken over by
another owner meanwhile: the store refuses it. That is no success: the log says
it was refused, what that means, and what to check. Retries of many workers
that failed together are jittered, so they do not all come back at once.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable

import pytest

import effectq
from effectq._runtime.leases import BACKOFF_BASE, BACKOFF_CAP, backoff, heartbeat
from effectq.errors import StoreError
from effectq.testing import Action, Fault, FaultyStore, Point


class _Flaky(FaultyStore):
    """Completion, release and mark_unknown fail while ``down`` (a network blip)."""

    def __init__(self, inner: effectq.Store) -> None:
        super().__init__(inner, [Fault(Point.AFTER_EFFECT, Action.ERROR, times=None)])
        self.down = True

    def up(self) -> None:
        self.down = False
        self.faults.clear()

    def release(self, key: str, token: int, *, error: str, retention_ms: int, ran: bool = True) -> bool:
        if self.down:
            raise StoreError(f"injected store failure on release of {key!r}")
        return super().release(key, token, error=error, retention_ms=retention_ms, ran=ran)

    def mark_unknown(self, key: str, token: int, *, error: str, ran: bool = True) -> bool:
        if self.down:
            raise StoreError(f"injected store failure on mark_unknown of {key!r}")
        return super().mark_unknown(key, token, error=error, ran=ran)


@pytest.fixture
def caplog_repairs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="effectq")
    return caplog


RETRIED_WITHIN = BACKOFF_CAP + 30.0
"""A deadline (never a measure) for a deferred write's next try: the store may have failed it
often enough meanwhile that its backoff reached the cap."""


def _until(check: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


def _repair_lines(caplog: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "effectq.repair" and key in r.getMessage()]


def _outcome_logged(caplog: pytest.LogCaptureFixture, key: str) -> list[logging.LogRecord]:
    """Once the heartbeat tried the write again and logged how it went (it succeeded, or was
    refused), the key's repair lines. Waits on that line itself: ``pending()`` is 0 a moment
    before the line is written."""
    outcomes = ("succeeded", "refused")
    _until(
        lambda: any(w in r.getMessage() for r in _repair_lines(caplog, key) for w in outcomes),
        f"a line saying how the retried write of {key} went",
        within=RETRIED_WITHIN,
    )
    return _repair_lines(caplog, key)


def _deferred() -> None:
    """The write the store failed waits in the heartbeat (while the store stays down)."""
    _until(lambda: heartbeat.pending()[1] == 1, "the failed write waits in the heartbeat")


def _refusal_logged(caplog: pytest.LogCaptureFixture, key: str) -> logging.LogRecord:
    """Once the heartbeat tried the write again: the line that says it was refused (and no
    line says it succeeded)."""
    lines = _outcome_logged(caplog, key)
    refused = [r for r in lines if "refused" in r.getMessage()]
    assert refused, [r.getMessage() for r in lines]
    assert not [r for r in lines if "succeeded" in r.getMessage()]
    return refused[0]


def _taken_over_meanwhile(store: effectq.Store, run_id: str, act: Callable[[int], int], n: int) -> str:
    """The first attempt's lease runs out while its write waits in the heartbeat; a second
    caller (a replay-safe effect) takes the key over and completes it. Returns the key."""
    with effectq.run(run_id, store=store):
        key = act.key(n)  # type: ignore[attr-defined]
    _until(lambda: store.get(key).in_doubt, "the first attempt's lease ran out")  # type: ignore[union-attr]
    with effectq.run(run_id, store=store):
        assert act(n) == n  # the takeover: a new token runs it again
    assert store.get(key).status is effectq.Status.COMPLETED  # type: ignore[union-attr]
    return key


def test_a_deferred_completion_refused_after_a_takeover_is_logged_as_refused(
    store: effectq.Store, caplog_repairs: pytest.LogCaptureFixture
) -> None:
    """The completion fails on the store, goes to the heartbeat, and meanwhile another owner takes
    the key over: the retried completion is refused. The log says so, at ERROR, with the warning
    that the effect may have applied twice, and never that the write succeeded."""
    flaky = _Flaky(store)
    run_id = f"takeover-{uuid.uuid4().hex[:8]}"
    applied: list[int] = []

    @effectq.effect(name="edges.charge", lease=0.3, replay_safe=True)
    def charge(n: int) -> int:
        applied.append(n)
        return n

    with effectq.run(run_id, store=flaky):
        assert charge(5) == 5  # applied; its completion waits in the heartbeat
    _deferred()
    key = _taken_over_meanwhile(store, run_id, charge, 5)
    assert applied == [5, 5]  # the case the log must warn about
    flaky.up()
    refused = _refusal_logged(caplog_repairs, key)
    assert refused.levelno == logging.ERROR
    assert "twice" in refused.getMessage() and "check the remote system" in refused.getMessage()


@pytest.mark.parametrize(
    ("raised", "level", "says"),
    [
        (TimeoutError, logging.ERROR, "check the remote system"),  # maybe applied: mark_unknown
        (ValueError, logging.WARNING, "did not apply"),  # not applied: release
    ],
)
def test_a_deferred_release_or_mark_unknown_refused_after_a_takeover_is_logged_as_refused(
    store: effectq.Store,
    caplog_repairs: pytest.LogCaptureFixture,
    raised: type[Exception],
    level: int,
    says: str,
) -> None:
    """The function raised; recording that (unknown for a maybe-applied error, released for
    another) fails on the store and goes to the heartbeat; another owner takes the key over
    meanwhile. The retried write is refused, and the log says so and what it means."""
    flaky = _Flaky(store)
    run_id = f"takeover-{uuid.uuid4().hex[:8]}"
    calls: list[int] = []

    @effectq.effect(name="edges.send", lease=0.3, replay_safe=True)
    def send(n: int) -> int:
        calls.append(n)
        if len(calls) == 1:
            raise raised("the first attempt fails")
        return n

    with effectq.run(run_id, store=flaky), pytest.raises(raised):
        send(3)
    _deferred()
    key = _taken_over_meanwhile(store, run_id, send, 3)
    flaky.up()
    refused = _refusal_logged(caplog_repairs, key)
    assert refused.levelno == level
    assert says in refused.getMessage()


def test_a_deferred_write_that_lands_is_logged_as_landed(
    store: effectq.Store, caplog_repairs: pytest.LogCaptureFixture
) -> None:
    """Without a takeover the same retried completion lands, and the log says it succeeded."""
    flaky = _Flaky(store)
    run_id = f"landed-{uuid.uuid4().hex[:8]}"

    @effectq.effect(name="edges.landed")
    def landed(n: int) -> int:
        return n

    with effectq.run(run_id, store=flaky):
        assert landed(1) == 1
        key = landed.key(1)
    flaky.up()
    lines = [r.getMessage() for r in _outcome_logged(caplog_repairs, key)]
    assert any("succeeded" in line for line in lines), lines
    assert not [line for line in lines if "refused" in line], lines
    assert store.get(key).status is effectq.Status.COMPLETED  # type: ignore[union-attr]


# -- jitter ---------------------------------------------------------------------------------


def test_retry_delays_are_jittered_over_the_whole_backoff_window() -> None:
    """Each retry's delay is drawn over (0, bound], the bound doubling from BACKOFF_BASE up to
    BACKOFF_CAP: workers that failed together spread their retries instead of coming back at once."""
    rng = random.Random(20)
    for attempt in range(12):
        bound = min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt)
        delays = [backoff(attempt, rng) for _ in range(400)]
        assert all(0 < d <= bound for d in delays), attempt
        assert len(set(delays)) == len(delays)  # no two workers alike
        assert min(delays) < 0.1 * bound and max(delays) > 0.9 * bound, attempt  # the whole window
        quarters = [sum(q * bound / 4 < d <= (q + 1) * bound / 4 for d in delays) for q in range(4)]
        assert min(quarters) > 60, (attempt, quarters)  # spread evenly, not bunched
    assert backoff(1000, rng) <= BACKOFF_CAP
