"""The claim requests and leases the store contract's tests share.

Part of :class:`~effectq.testing.StoreContract`: the suite in :mod:`effectq.testing.contract`
and its part on unknown outcomes in :mod:`effectq.testing.unknown_contract` claim with these.
"""

from __future__ import annotations

import time
import uuid

from ..store.base import ClaimRequest

__all__ = ["LIVE_MS", "RETENTION_MS", "SHORT_MS", "expire", "request"]

LIVE_MS = 5_000
"""A lease that cannot run out during a test."""
SHORT_MS = 80
"""A lease a test lets run out."""
RETENTION_MS = 60_000


def request(
    owner: str | None = None, lease_ms: int = LIVE_MS, run_id: str = "run-1", **kwargs: object
) -> ClaimRequest:
    return ClaimRequest(
        lease_ms=lease_ms,
        owner=owner or uuid.uuid4().hex,
        name="contract.effect",
        run_id=run_id,
        retention_ms=RETENTION_MS,
        **kwargs,  # type: ignore[arg-type]
    )


def expire() -> None:
    time.sleep(SHORT_MS / 1000 * 2.5)
