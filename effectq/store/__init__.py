"""Stores: where effect records live.

:class:`MemoryStore` keeps them in this process; :class:`RedisStore` on Redis
(needs ``effectq[redis]``), loaded on first use so ``import effectq`` works
without redis-py installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Claim, ClaimKind, ClaimRequest, Record, ResultState, Status, Store
from .memory import MemoryStore
from .operators import OperatorStore, Standing, Summary

if TYPE_CHECKING:
    from .redis import RedisStore

__all__ = [
    "Claim",
    "ClaimKind",
    "ClaimRequest",
    "MemoryStore",
    "OperatorStore",
    "Record",
    "RedisStore",
    "ResultState",
    "Standing",
    "Status",
    "Store",
    "Summary",
]


def __getattr__(name: str) -> Any:
    if name == "RedisStore":
        from .redis import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
