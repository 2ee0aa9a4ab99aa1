"""The benchmark suite runs (a smoke run at a tiny size; figures are bench/'s business, not the tests')."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_benchmarks_run_and_report(tmp_path: Path) -> None:
    """bench/run.py --size smoke prints and writes every section, and each key ran exactly once."""
    out = subprocess.run(
        [sys.executable, "bench/run.py", "--size", "smoke", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = (tmp_path / "latest.md").read_text()
    for section in (
        "Latency of one effect",
        "A task with one effect",
        "Where the time goes",
        "redelivered task",
        "Contention",
        "memory per completed record",
        "End to end",
    ):
        assert section in report
    assert "| NO " not in report  # contention: every key executed exactly once
    assert "floor: SET NX + SET" in report  # end to end: the floor layer ran beside effectq
