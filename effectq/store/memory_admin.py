"""The operator primitives of :class:`~effectq.store.memory.MemoryStore`: listing, summary, purge.

No indexes: every listing reads the rows (a memory store holds what one process made).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .base import Record, Status
from .memory_rows import _Row
from .operators import Standing, Summary, since, standing

__all__ = ["MemoryOperations"]

_EPOCH = datetime.fromtimestamp(0, UTC)


def _dt(ms: int | None) -> datetime | None:
    return None if not ms else datetime.fromtimestamp(ms / 1000, UTC)


class MemoryOperations:
    """What an operator asks of a memory store, for :class:`~effectq.store.memory.MemoryStore` to inherit."""

    _lock: threading.Lock
    _rows: dict[str, _Row]
    _clock: Callable[[], int]

    if TYPE_CHECKING:

        def _row(self, key: str, now: int) -> _Row | None: ...

    def records(self) -> Iterator[Record]:
        """Every live record (a snapshot)."""
        with self._lock:
            now = self._clock()
            rows = [(k, self._row(k, now)) for k in list(self._rows)]
            snapshot = [self._record(k, r) for k, r in rows if r is not None]
        yield from snapshot

    scan = records

    def clock(self) -> datetime:
        return datetime.fromtimestamp(self._clock() / 1000, UTC)

    def _standing(self, where: Standing) -> list[Record]:
        now = self.clock()
        return [record for record in self.records() if standing(record, now) is where]

    def in_doubt(self, *, limit: int | None = None) -> Iterator[Record]:
        found = sorted(self._standing(Standing.UNKNOWN), key=lambda r: since(r, Standing.UNKNOWN) or _EPOCH)
        yield from found[:limit]

    def in_flight(self, *, limit: int | None = None) -> Iterator[Record]:
        found = sorted(self._standing(Standing.IN_FLIGHT), key=lambda r: r.lease_expires_at or _EPOCH)
        yield from found[:limit]

    def summary(self) -> Summary:
        doubt = list(self.in_doubt())
        return Summary(
            in_doubt=len(doubt),
            oldest_in_doubt=since(doubt[0], Standing.UNKNOWN) if doubt else None,
            in_flight=len(self._standing(Standing.IN_FLIGHT)),
        )

    def purge(self, record: Record, *, run_id: str = "", older_than_ms: int = 0) -> bool:
        key = record.ref or record.key
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None:
                return False
            settled = row.status in (Status.COMPLETED, Status.RELEASED, Status.FAILED) or (
                row.status is Status.PENDING and row.lease_until <= now
            )
            if not settled or (run_id and row.run_id != run_id):
                return False
            if older_than_ms and row.updated > now - older_than_ms:
                return False
            del self._rows[key]
            return True

    def prune_indexes(self) -> int:
        return 0  # no indexes: the rows are the only truth

    def _record(self, key: str, row: _Row) -> Record:
        return Record(
            key=key,
            status=row.status,
            token=row.token,
            attempt=row.attempt,
            name=row.name,
            run_id=row.run_id,
            owner=row.owner,
            lease_expires_at=_dt(row.lease_until),
            created_at=_dt(row.created),
            updated_at=_dt(row.updated),
            error=row.error,
            result=row.result,
            result_state=row.result_state,
            input_hash=row.input_hash,
            expires_at=_dt(row.expires),
            unknown_since=_dt(row.unknown_since) if row.status is Status.UNKNOWN else None,
            ref=key,
            failure=row.failure,
        )
