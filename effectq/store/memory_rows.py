"""The row a :class:`~effectq.store.memory.MemoryStore` keeps for each key.

Its own module because both halves of the memory store read it: the primitives
(:mod:`effectq.store.memory`) and the operator's listing (:mod:`effectq.store.memory_admin`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .base import ResultState, Status

__all__ = ["_Row"]


@dataclass(slots=True)
class _Row:
    status: Status
    token: int
    attempt: int
    lease_until: int  # ms; 0 = no lease
    owner: str
    name: str
    run_id: str
    created: int
    updated: int
    input_hash: str = ""
    result: bytes | None = None
    result_state: ResultState = ResultState.STORED
    error: str = ""
    expires: int = 0  # ms; 0 = kept until changed
    unknown_since: int = 0  # ms; when it became UNKNOWN
    failure: str = ""  # a FAILED row's recorded terminal exception ("" when parked)
    reconciler: tuple[str, str, str] | None = None
    """Name, run id and input hash of the holder of a reconcile lease on an UNKNOWN: the row
    keeps the recorded attempt's (what the reconcile asks about) until dispatch runs the holder."""
    watchers: list[Callable[[], None]] = field(default_factory=list)
