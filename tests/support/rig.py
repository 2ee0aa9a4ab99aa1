"""A real worker to test against: one workload configuration's worker, producer and ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from effectq.chaos.workload import WorkloadConfig
from effectq.testing.ledger import Ledger
from effectq.testing.workers import Producer, WorkerProcess, wait_until


class Rig:
    """A worker of ``config`` (``w0``), the producer that sends it tasks and deletes the run's
    broker, backend and store keys afterwards, and the ledger that judges what applied."""

    def __init__(self, config: WorkloadConfig, log_dir: Path, *, pool: str, log_lines: int = 60) -> None:
        self.config = config
        self.ledger = Ledger.from_url(config.ledger, config.name)
        self.producer = Producer(config)
        self.worker = WorkerProcess(config, "w0", log_dir=log_dir, pool=pool)
        self.log_lines = log_lines

    def wait(self, kind: str, count: int = 1, timeout: float = 120.0) -> list[dict[str, Any]]:
        """The ledger's events of ``kind`` once there are ``count``; else fail with the worker's log."""
        try:
            return wait_until(  # type: ignore[no-any-return]
                lambda: len(self.ledger.events(kind)) >= count and self.ledger.events(kind),
                timeout=timeout,
                what=f"{count} '{kind}' event(s)",
            )
        except TimeoutError as exc:
            tail = self.worker.log_tail(self.log_lines)
            raise AssertionError(f"{exc}\n--- worker log ---\n{tail}") from None

    def close(self) -> None:
        self.worker.stop()
        self.producer.cleanup()
