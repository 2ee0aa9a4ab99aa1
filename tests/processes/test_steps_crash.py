"""Steps across real process deaths: a process SIGKILLed inside a step, then the run again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import redis

pytestmark = [pytest.mark.redis, pytest.mark.slow]

CHILD = textwrap.dedent(
    """
    import sys, time
    import redis
    import effectq

    url, namespace, hang = sys.argv[1], sys.argv[2], sys.argv[3] == "hang"
    client = redis.Redis.from_url(url)
    store = effectq.RedisStore(client, namespace=namespace)
    counters = f"effectq:{{{namespace}}}:test"

    @effectq.step(name="plan", lease=1.0)
    def plan(goal: str) -> str:
        client.hincrby(counters, "plan", 1)
        return f"plan for {goal}"

    @effectq.step(name="think", lease=1.0)
    def think(plan: str) -> str:
        client.hincrby(counters, "think", 1)
        if hang:
            client.hset(counters, "inside", 1)
            time.sleep(600)
        return plan + ", thought through"

    with effectq.run("run-1", store=store):
        print(think(plan("refund")), flush=True)
    store.close()
    """
)


def _child(redis_url: str, namespace: str, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, redis_url, namespace, mode],
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_for(predicate: object, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_sigkill_inside_a_step_runs_it_again(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """Killed inside step 2: the next attempt replays step 1 and runs step 2 again, once."""
    counters = f"effectq:{{{namespace}}}:test"
    victim = _child(redis_url, namespace, "hang")
    try:
        _wait_for(
            lambda: redis_client.hget(counters, "inside") or victim.poll() is not None, "the step to start"
        )
        assert victim.poll() is None, "the first attempt ended before it was killed"
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait(timeout=60) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
        assert victim.stdout is not None
        victim.stdout.close()

    outputs = []
    for _ in range(2):  # the redelivery, then one more attempt that replays everything
        again = _child(redis_url, namespace, "finish")
        out, _ = again.communicate(timeout=120)
        assert again.returncode == 0
        outputs.append(out.strip())

    assert outputs == ["plan for refund, thought through"] * 2
    counts = {k.decode(): int(v) for k, v in redis_client.hgetall(counters).items()}
    print(f"\nmodel calls across a SIGKILL inside step 2: plan {counts['plan']}, think {counts['think']}")
    assert counts["plan"] == 1  # journaled before the kill: never paid again
    assert counts["think"] == 2  # killed inside: ran again once, then journaled
