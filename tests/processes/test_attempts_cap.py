"""A poison loop stops: a worker SIGKILLed inside the same effect on every redelivery."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid

import pytest
import redis

import effectq
from effectq.store.base import Status
from tests.support.probes import ROOT, read_line

pytestmark = pytest.mark.slow


def _child(redis_url: str, namespace: str, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.procs", "poison", redis_url, namespace, run_id, "0.3"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_worker_killed_inside_the_same_effect_parks_the_key(
    redis_url: str, redis_client: redis.Redis, namespace: str
) -> None:
    """A replay-safe effect whose worker is SIGKILLed inside it each time (an OOM kill, say) runs
    max_attempts (3) times; the fourth worker takes over the dead holder's claim and finds the key
    parked: AttemptsExhausted, the function not run again, the record failed with the last error."""
    run_id = f"poison-{uuid.uuid4().hex[:8]}"
    for attempt in (1, 2, 3):
        proc = _child(redis_url, namespace, run_id)
        try:
            assert read_line(proc) == f"inside {attempt}"
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    proc = _child(redis_url, namespace, run_id)
    try:
        assert read_line(proc) == "parked 3"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    store = effectq.RedisStore(redis_client, namespace=namespace)
    parked = [r for r in store.scan() if r.run_id == run_id]
    assert [(r.status, r.attempt) for r in parked] == [(Status.FAILED, 3)]
    assert "lease expired while dispatched" in parked[0].error
