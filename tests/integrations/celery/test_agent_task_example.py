"""examples/agent_task.py: a real Celery worker SIGKILLed after a refund, the task redelivered."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import delete_namespace

pytestmark = [pytest.mark.redis, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "agent_task.py"


def test_redelivered_agent_pays_each_step_once_and_applies_each_tool_once(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """After the SIGKILL and the redelivery: one model call per step, one refund, one email."""
    pytest.importorskip("celery")
    env = {**os.environ, "AGENT_REDIS_URL": redis_url, "AGENT_NAMESPACE": namespace}
    proof = subprocess.Popen(
        [sys.executable, str(EXAMPLE)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # the example and its workers: one group to stop
    )
    try:
        out, _ = proof.communicate(timeout=300)
    finally:
        if proof.poll() is None:
            os.killpg(proof.pid, signal.SIGKILL)
            proof.wait()
        for key in redis_client.scan_iter(match=f"{namespace}:*", count=1000):
            redis_client.delete(key)
        delete_namespace(redis_client, namespace)
    print(out[out.find("task ") :])
    counts = {m[1]: int(m[2]) for m in re.finditer(r"^  (\S.*?)\s{2,}(\d+)$", out, re.MULTILINE)}
    assert proof.returncode == 0, out
    assert f"first worker exit code -{int(signal.SIGKILL)}" in out
    assert counts["deliveries"] == 2
    assert [counts[f"model step {n}"] for n in range(4)] == [1, 1, 1, 1]
    assert counts["applied refund"] == counts["applied send_email"] == 1
    assert counts["read lookup_order"] == 2  # read-only: runs again on the redelivery
