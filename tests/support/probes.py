"""What a test reads from a child process or from Redis directly, beside the store's own API."""

from __future__ import annotations

import json
import selectors
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[2]
"""The checkout: where ``python -m tests.support.procs`` and the like run."""


def read_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """The child's next line of output (children flush every line)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                line = proc.stdout.readline()
                if line:
                    return line.strip()
            if proc.poll() is not None:
                break
    raise AssertionError(f"child {proc.args} said nothing (exit {proc.poll()})")


def applications(client: redis.Redis, ledger: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in client.lrange(f"{ledger}:log", 0, -1)]


def stored_status(client: Any, record_key: str) -> str:
    """'c' for a completed (packed) record, else the hash's status field; '' for none."""
    if client.type(record_key) == b"string":
        return "c"
    found = client.hget(record_key, "s")
    return found.decode() if found else ""
