"""An in-process store: the reference implementation of the contract.

For tests and single-process programs. It keeps records in a dict behind one
lock and follows the same state machine as the Lua scripts, transition for
transition (the hypothesis test in ``tests/unit/test_state_model.py`` holds them to
one reference model). Nothing survives the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..errors import ResolveRefusedError
from ..keys import check_namespace
from .base import Claim, ClaimKind, ClaimRequest, Record, ResultState, Status, Store, Unsubscribe
from .memory_admin import MemoryOperations
from .memory_rows import _Row

__all__ = ["MemoryStore"]

LEASE_EXPIRED = "lease expired while dispatched (holder {owner})"


class MemoryStore(MemoryOperations, Store):
    """A store in this process's memory.

    Args:
        namespace: isolates keys; two namespaces never see each other's records.
        clock: milliseconds since the epoch; injectable so tests can move time.
    """

    def __init__(self, *, namespace: str = "default", clock: Callable[[], int] | None = None) -> None:
        self._namespace = check_namespace(namespace)
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._rows: dict[str, _Row] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MemoryStore(namespace={self._namespace!r}, records={len(self._rows)})"

    @property
    def namespace(self) -> str:
        return self._namespace

    # -- helpers -------------------------------------------------------------------------

    def _row(self, key: str, now: int) -> _Row | None:
        row = self._rows.get(key)
        if row is not None and row.expires and row.expires <= now:
            del self._rows[key]
            return None
        return row

    @staticmethod
    def _notify(row: _Row) -> None:
        watchers, row.watchers = row.watchers, []
        for callback in watchers:
            callback()

    # -- primitives ----------------------------------------------------------------------

    def claim(self, key: str, request: ClaimRequest) -> Claim:
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None:
                status = Status.PENDING if request.reconcile_first else Status.DISPATCHED
                row = _Row(
                    status=status,
                    token=now,
                    attempt=0 if request.reconcile_first else 1,
                    lease_until=now + request.lease_ms,
                    owner=request.owner,
                    name=request.name,
                    run_id=request.run_id,
                    created=now,
                    updated=now,
                    input_hash=request.input_hash,
                    expires=now + request.retention_ms if request.reconcile_first else 0,
                )
                self._rows[key] = row
                return self._granted(row)
            status = row.status
            if status is Status.COMPLETED:
                found = self._run_records(request.run_id, now) if request.prefetch else {}
                return self._completed(row, hint=found if len(found) > 1 else None)  # none for a run of one
            if status is Status.FAILED:
                return self._failed(row)
            if status is Status.RELEASED:
                return self._reclaim(row, request, now)
            if row.owner == request.owner and row.lease_until:
                # a retried claim of our own, nobody else's since: the same grant, a lease from now
                row.lease_until = now + request.lease_ms
                row.updated = now
                return self._granted(row)
            if status is Status.PENDING:
                if row.lease_until > now:
                    return self._in_flight(row, now)
                return self._reclaim(row, request, now)  # the pre-reconciler died; nothing ran
            if status is Status.DISPATCHED:
                if row.lease_until > now:
                    return self._in_flight(row, now)
                row.status = Status.UNKNOWN
                row.error = LEASE_EXPIRED.format(owner=row.owner)
                row.unknown_since = row.lease_until
                row.lease_until = 0
                row.updated = now
            # UNKNOWN
            if row.lease_until > now:
                return self._in_flight(row, now)
            if request.can_reconcile:
                row.token += 1
                row.lease_until = now + request.lease_ms
                row.owner = request.owner
                row.reconciler = (request.name, request.run_id, request.input_hash)
                row.updated = now
                return self._granted(row)
            if request.replay_safe:
                if _exhausted(row, request.max_attempts):
                    return self._park(row, now, request.retention_ms)
                row.token += 1
                row.attempt += 1
                row.status = Status.DISPATCHED
                row.lease_until = now + request.lease_ms
                row.owner = request.owner
                row.name, row.run_id, row.input_hash = request.name, request.run_id, request.input_hash
                row.updated = now
                return self._granted(row)
            return Claim(
                ClaimKind.UNKNOWN,
                token=row.token,
                attempt=row.attempt,
                status=Status.UNKNOWN,
                error=row.error,
                owner=row.owner,
                input_hash=row.input_hash,
            )

    def _reclaim(self, row: _Row, request: ClaimRequest, now: int) -> Claim:
        if not request.reconcile_first and _exhausted(row, request.max_attempts):
            return self._park(row, now, request.retention_ms)
        row.token += 1
        row.status = Status.PENDING if request.reconcile_first else Status.DISPATCHED
        if row.status is Status.DISPATCHED:
            row.attempt += 1
        row.lease_until = now + request.lease_ms
        row.owner = request.owner
        row.name, row.run_id = request.name, request.run_id
        row.input_hash = request.input_hash
        row.reconciler = None
        row.error = ""
        row.result, row.result_state = None, ResultState.STORED
        row.expires = now + request.retention_ms if request.reconcile_first else 0
        row.updated = now
        return self._granted(row)

    def _park(self, row: _Row, now: int, retention_ms: int) -> Claim:
        """Attempts exhausted: taken over (the token bumped) and kept as FAILED, its last error kept."""
        row.token += 1
        row.status = Status.FAILED
        row.lease_until = 0
        row.owner = ""
        row.failure = ""
        row.reconciler = None
        row.updated = now
        row.expires = now + retention_ms
        return self._failed(row)

    @staticmethod
    def _failed(row: _Row) -> Claim:
        return Claim(
            ClaimKind.FAILED,
            token=row.token,
            attempt=row.attempt,
            status=Status.FAILED,
            error=row.error,
            failure=row.failure,
        )

    @staticmethod
    def _completed(row: _Row, hint: object = None) -> Claim:
        return Claim(
            ClaimKind.COMPLETED,
            token=row.token,
            attempt=row.attempt,
            status=Status.COMPLETED,
            result=row.result,
            result_state=row.result_state,
            input_hash=row.input_hash,
            prefetch_hint=hint,
        )

    @staticmethod
    def _granted(row: _Row) -> Claim:
        kind = ClaimKind.CLAIMED if row.status is Status.DISPATCHED else ClaimKind.RECONCILE
        return Claim(
            kind,
            token=row.token,
            attempt=row.attempt,
            status=row.status,
            error=row.error,
            input_hash=row.input_hash,
            owner=row.owner,
        )

    @staticmethod
    def _in_flight(row: _Row, now: int) -> Claim:
        return Claim(
            ClaimKind.IN_FLIGHT,
            token=row.token,
            attempt=row.attempt,
            status=row.status,
            lease_ms=row.lease_until - now,
            owner=row.owner,
            input_hash=row.input_hash,
        )

    def complete(
        self,
        key: str,
        token: int,
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool:
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None or row.token != token:
                return False
            if row.status is Status.COMPLETED:
                return True
            if row.status in (Status.RELEASED, Status.FAILED):
                return False
            row.status = Status.COMPLETED
            row.result = result if result_state is ResultState.STORED else None
            row.result_state = result_state
            row.lease_until = 0
            row.owner = ""
            row.error = ""
            row.updated = now
            row.expires = now + retention_ms
            self._notify(row)
            return True

    def release(self, key: str, token: int, *, error: str, retention_ms: int, ran: bool = True) -> bool:
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None or row.token != token:
                return False
            if row.status in (Status.PENDING, Status.DISPATCHED):
                if row.status is Status.DISPATCHED and not ran:
                    row.attempt = max(0, row.attempt - 1)  # given back: only executions count
                row.status = Status.RELEASED
                row.error = error
                row.expires = now + retention_ms
            elif row.status is not Status.UNKNOWN:
                return False
            row.lease_until = 0
            row.owner = ""
            row.updated = now
            self._notify(row)
            return True

    def mark_unknown(self, key: str, token: int, *, error: str, ran: bool = True) -> bool:
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None or row.token != token:
                return False
            if row.status is Status.UNKNOWN:
                return True
            if row.status is not Status.DISPATCHED:
                return False
            if not ran:
                row.attempt = max(0, row.attempt - 1)  # given back: only executions count
            row.status = Status.UNKNOWN
            row.error = error
            row.unknown_since = now
            row.lease_until = 0
            row.updated = now
            row.expires = 0
            self._notify(row)
            return True

    def fail(self, key: str, token: int, *, error: str, failure: str, retention_ms: int) -> bool:
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None or row.token != token:
                return False
            if row.status is Status.FAILED:
                return True
            if row.status is not Status.DISPATCHED:
                return False
            row.status = Status.FAILED
            row.error = error
            row.failure = failure
            row.lease_until = 0
            row.owner = ""
            row.updated = now
            row.expires = now + retention_ms
            self._notify(row)
            return True

    def dispatch(
        self, key: str, token: int, *, lease_ms: int, max_attempts: int = 0, retention_ms: int = 0
    ) -> int:
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None or row.token != token:
                return 0
            if row.status is Status.DISPATCHED:  # a retry of our own: the same attempt, a lease from now
                row.lease_until = now + lease_ms
                row.updated = now
                return row.attempt
            if row.status not in (Status.PENDING, Status.UNKNOWN):
                return 0
            if row.status is Status.UNKNOWN and not row.lease_until:
                return 0  # the holder that left it unknown may not re-dispatch it
            if _exhausted(row, max_attempts):
                self._park(row, now, retention_ms)
                return -1
            if row.status is Status.UNKNOWN and row.reconciler is not None:
                row.name, row.run_id, row.input_hash = row.reconciler  # the attempt that executes
                row.reconciler = None
            row.status = Status.DISPATCHED
            row.attempt += 1
            row.lease_until = now + lease_ms
            row.updated = now
            row.expires = 0
            return row.attempt

    def renew(self, key: str, token: int, *, lease_ms: int) -> bool:
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None or row.token != token or not row.lease_until:
                return False
            if row.status not in (Status.PENDING, Status.DISPATCHED, Status.UNKNOWN):
                return False
            row.lease_until = now + lease_ms
            return True

    def resolve(
        self,
        key: str,
        *,
        applied: bool,
        result: bytes | None = None,
        result_state: ResultState = ResultState.STORED,
        note: str = "",
        retention_ms: int,
    ) -> Record:
        if applied and result is None and result_state is ResultState.STORED:
            result_state = ResultState.RESOLVED_WITHOUT_RESULT  # nothing to replay: say so
        kept = result if applied and result_state is ResultState.STORED else None
        with self._lock:
            now = self._clock()
            row = self._row(key, now)
            if row is None:
                raise ResolveRefusedError(key, None)
            doubtful = row.status in (Status.UNKNOWN, Status.FAILED) or (
                row.status is Status.DISPATCHED and row.lease_until <= now
            )
            if not doubtful:
                if applied:
                    asked = (Status.COMPLETED, result_state, kept)
                    settled = (row.status, row.result_state, row.result) == asked
                else:
                    settled = row.status is Status.RELEASED
                if settled and row.error == note:
                    return self._record(key, row)  # settled so already: this decision, again
                raise ResolveRefusedError(key, row.status.value, _refusal(row.status))
            row.token += 1
            row.lease_until = 0
            row.owner = ""
            row.updated = now
            row.expires = now + retention_ms
            row.error = note
            row.failure = ""
            row.reconciler = None
            if applied:
                row.status = Status.COMPLETED
                row.result = kept
                row.result_state = result_state
            else:
                row.status = Status.RELEASED
                row.attempt = 0  # the operator's verdict starts the count again
            self._notify(row)
            return self._record(key, row)

    def get(self, key: str) -> Record | None:
        with self._lock:
            row = self._row(key, self._clock())
            return None if row is None else self._record(key, row)

    def watch(self, key: str, callback: Callable[[], None]) -> Unsubscribe:
        with self._lock:
            row = self._rows.get(key)
            if row is None or row.status not in (Status.PENDING, Status.DISPATCHED, Status.UNKNOWN):
                callback()
                return lambda: None
            row.watchers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in row.watchers:
                    row.watchers.remove(callback)

        return unsubscribe

    def prefetch(self, run_id: str, hint: object = None) -> dict[str, Claim]:
        """The completed records of a run, by effect key: those a completed claim brought
        (``hint``), else read now."""
        if isinstance(hint, dict):
            return hint
        with self._lock:
            return self._run_records(run_id, self._clock())

    def _run_records(self, run_id: str, now: int) -> dict[str, Claim]:
        return {
            key: self._completed(row)
            for key in list(self._rows)
            if (row := self._row(key, now)) is not None
            and row.status is Status.COMPLETED
            and row.run_id == run_id
        }


def _exhausted(row: _Row, max_attempts: int) -> bool:
    """Whether another execution would be past ``max_attempts`` (0: no cap)."""
    return 0 < max_attempts <= row.attempt


def _refusal(status: Status) -> str:
    if status is Status.COMPLETED:
        return "it is completed; a completed effect is never re-run or rewritten"
    if status is Status.RELEASED:
        return "it is released (not applied); the next call applies it"
    return "it is in flight with a live lease; wait for it, or for the lease to run out"
