"""A claim whose caller gave up before its reply came is taken back, on the real Redis.

A cancelled asyncio task, a Celery or Dramatiq time limit, ^C: the claim was
written and may land after its caller stopped listening, with nothing run under
it. Left alone, it would read as in flight until its lease ran out, then as
unknown. The heartbeat takes it back with the same owner and releases it.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid

import pytest
import redis

import effectq
from effectq._runtime.leases import heartbeat
from tests.support import pauses


@pytest.fixture(scope="module")
def redis_url(private_redis_url: str) -> str:
    """These tests pause clients: they run on a server of their own."""
    return private_redis_url


def test_a_task_cancelled_while_its_claim_is_on_its_way_leaves_no_false_unknown(
    redis_store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_url: str
) -> None:
    """Redis paused, the claim queued, the task cancelled: Redis grants the claim after the caller
    gave up, and nothing runs under it. The heartbeat takes it back (the same owner) and releases
    it, so the next call applies the effect instead of waiting out the lease to meet unknown."""
    admin = redis.Redis.from_url(redis_url)
    run_id = f"aclaimcancel-{uuid.uuid4().hex[:8]}"
    applied: list[int] = []

    @effectq.effect(name="interrupted.cancelled", lease=60.0, wait=10.0)
    async def act(n: int) -> int:
        applied.append(n)
        return n

    async def main() -> None:
        async with effectq.run(run_id, store=redis_store):
            with pauses.writes_paused(admin):
                task = asyncio.create_task(act(7))
                await pauses.until_held_async(admin)  # the claim is written and waits in Redis
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task

    try:
        asyncio.run(main())
    finally:
        admin.close()
    with effectq.run(run_id, store=onlooker):
        key = act.key(7)
    _until_released(onlooker, key)

    async def again() -> int:
        async with effectq.run(run_id, store=onlooker):
            return await act(7)

    assert asyncio.run(again()) == 7
    assert applied == [7]  # applied once, by the second call, after the first claim was released
    assert heartbeat.pending()[1] == 0


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs pthread_kill")
def test_a_time_limit_raised_while_the_claim_is_on_its_way_leaves_no_false_unknown(
    redis_store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_url: str
) -> None:
    """The same for a synchronous effect whose claim's wait is cut by a signal handler that
    raises (Celery's soft time limit works so)."""
    admin = redis.Redis.from_url(redis_url)
    run_id = f"alarm-{uuid.uuid4().hex[:8]}"
    applied: list[int] = []

    @effectq.effect(name="interrupted.alarmed", lease=60.0, wait=10.0)
    def act(n: int) -> int:
        applied.append(n)
        return n

    soft_time_limit = pytest.importorskip("billiard.exceptions").SoftTimeLimitExceeded

    def limit(signum: int, frame: object) -> None:  # as Celery's soft time limit does, wherever the task is
        raise soft_time_limit("soft time limit exceeded")

    held: list[bool] = []

    def alarm_once_held() -> None:  # the time limit cuts in while the claim waits in Redis
        watcher = redis.Redis.from_url(redis_url)
        try:
            pauses.until_held(watcher)
            held.append(True)
        finally:
            watcher.close()
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGALRM)

    previous = signal.signal(signal.SIGALRM, limit)
    try:
        with effectq.run(run_id, store=redis_store), pauses.writes_paused(admin):
            alarm = threading.Thread(target=alarm_once_held, daemon=True)
            alarm.start()
            with pytest.raises(soft_time_limit):  # the task's to handle, not retried as a store failure
                act(8)
            alarm.join()
    finally:
        signal.signal(signal.SIGALRM, previous)
        admin.close()
    assert held == [True]
    assert applied == []
    with effectq.run(run_id, store=onlooker):
        key = act.key(8)
    _until_released(onlooker, key)
    with effectq.run(run_id, store=onlooker):
        assert act(8) == 8
    assert applied == [8]
    assert heartbeat.pending()[1] == 0


def _until_released(store: effectq.RedisStore, key: str) -> None:
    """The claim landed after its caller gave up, and the heartbeat gave it back."""
    deadline = time.monotonic() + 10
    record = store.get(key)
    while time.monotonic() < deadline and (record is None or record.status is not effectq.Status.RELEASED):
        time.sleep(0.05)
        record = store.get(key)
    assert record is not None and record.status is effectq.Status.RELEASED
