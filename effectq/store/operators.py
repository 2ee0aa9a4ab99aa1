"""What operators need of a store: records by where they stand, a summary, and purge.

The engine never calls these; ``effectq list``, ``stats``, ``purge`` and the
Prometheus gauges do (through :mod:`effectq.ops.admin`). A store that implements
them is an :class:`OperatorStore`; :class:`effectq.testing.OperatorStoreContract`
is the suite it passes.

Listing what is in doubt or in flight must stay cheap while millions of
completed records sit beside them, so a store keeps indexes of both (the Redis
store: two sorted sets per bucket, kept by the scripts) and reads only those.
Everything else (completed, released, filtering by run) may scan every record.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable

from .base import Record, Status, Store

__all__ = ["OperatorStore", "Standing", "Summary", "since", "standing"]


class Standing(enum.StrEnum):
    """Where a record stands, for an operator (``effectq list --status``)."""

    UNKNOWN = "unknown"
    """In doubt: UNKNOWN, or DISPATCHED with a lease that ran out (its holder is gone).
    Only an operator or a reconcile hook settles it; purge never deletes it."""
    IN_FLIGHT = "in-flight"
    """PENDING or DISPATCHED with a live lease: a holder is working on it."""
    COMPLETED = "completed"
    """Applied; replayed until its retention runs out."""
    RELEASED = "released"
    """Not applied (RELEASED, or PENDING whose holder died before running it): the next call applies it."""
    FAILED = "failed"
    """Not applied and not tried again: a recorded terminal exception, or a key parked after
    ``max_attempts``. Every call raises until ``effectq resolve KEY --not-applied`` or the retention."""


def standing(record: Record, now: datetime) -> Standing:
    """Where ``record`` stands at ``now`` (the store's clock: see :meth:`OperatorStore.clock`)."""
    status = record.status
    if status is Status.COMPLETED:
        return Standing.COMPLETED
    if status is Status.RELEASED:
        return Standing.RELEASED
    if status is Status.UNKNOWN:
        return Standing.UNKNOWN
    if status is Status.FAILED:
        return Standing.FAILED
    live = record.lease_expires_at is not None and record.lease_expires_at > now
    if live:
        return Standing.IN_FLIGHT
    return Standing.UNKNOWN if status is Status.DISPATCHED else Standing.RELEASED


def since(record: Record, where: Standing) -> datetime | None:
    """Since when ``record`` has stood where it stands: the age an operator sorts and filters by.

    In doubt: since it became unknown (a dead holder's: since its lease ran out).
    Otherwise: since it last changed (claimed, completed, released).
    """
    if where is Standing.UNKNOWN:
        if record.status is Status.UNKNOWN:
            return record.unknown_since or record.updated_at
        return record.lease_expires_at
    return record.updated_at


@dataclass(frozen=True, slots=True)
class Summary:
    """What the indexes say, without reading every record.

    Attributes:
        in_doubt: records in doubt (unknown, or dispatched with a dead holder).
        oldest_in_doubt: since when the oldest of them has been in doubt.
        in_flight: records held by a live lease.
    """

    in_doubt: int
    oldest_in_doubt: datetime | None
    in_flight: int


@runtime_checkable
class OperatorStore(Store, Protocol):
    """A store an operator can inspect and clean up (``effectq list/stats/purge``)."""

    def clock(self) -> datetime:
        """The store's clock (UTC): leases and ages are judged by it, not by this host's."""
        ...

    def in_doubt(self, *, limit: int | None = None) -> Iterator[Record]:
        """Records in doubt, the longest in doubt first, from an index (no full scan)."""
        ...

    def in_flight(self, *, limit: int | None = None) -> Iterator[Record]:
        """Records held by a live lease, the soonest lease end first, from an index."""
        ...

    def scan(self) -> Iterator[Record]:
        """Every record of the namespace, in no particular order (reads everything)."""
        ...

    def summary(self) -> Summary:
        """Counts and the oldest doubt, from the indexes; cheap enough for every scrape."""
        ...

    def purge(self, record: Record, *, run_id: str = "", older_than_ms: int = 0) -> bool:
        """Delete one settled record (as listed or read): completed, released, or pending whose holder died.

        Never a record in doubt or in flight. Atomic with its conditions: the
        record must still be settled, belong to ``run_id`` (when given) and be
        unchanged for ``older_than_ms`` (when given) at the moment it is deleted.
        The record is found by its ``ref`` (its ``key`` when that is empty).
        Returns whether it was deleted.
        """
        ...

    def prune_indexes(self) -> int:
        """Drop index entries whose record is gone (deleted by hand, or expired). Returns how many."""
        ...
