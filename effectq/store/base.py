"""The store contract: a narrow set of atomic primitives over effect records.

A store keeps one record per (namespace, effect key) and changes it only through
the primitives below, each of which is atomic (one Lua script on Redis, one
critical section in memory). Primitives *return* expected outcomes (completed,
in flight, unknown, lost a race) and *raise* :class:`~effectq.errors.StoreError`
only when the store itself fails. The engine above turns outcomes into
behaviour; keys, hashing and policy never live in a store.

State machine (``docs/protocol.md`` has the timelines)::

               claim                     complete
    (none) ───────────► DISPATCHED ─────────────────► COMPLETED
      ▲ release │          │  │ mark_unknown / lease ran out
      │         ▼          │  └────────────────────► UNKNOWN ──┐
      └──── RELEASED ◄─────┘ release                   │ ▲      │ claim with reconcile
                                                       │ └──────┘ (reconcile lease)
            claim(reconcile_first)      dispatch       │ dispatch / complete
    (none) ───────────► PENDING ───────► DISPATCHED ◄──┘

    DISPATCHED ── fail ──► FAILED        a terminal exception, replayed by every later claim
    RELEASED / UNKNOWN ── claim ──► FAILED, PENDING / UNKNOWN ── dispatch ──► FAILED
                                         past max_attempts: parked instead of executed

Every transition but ``claim`` compares the fencing token the claim handed out,
so a holder whose claim was taken over cannot write.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "AsyncStore",
    "Claim",
    "ClaimKind",
    "ClaimRequest",
    "Prefetched",
    "Record",
    "ResultState",
    "Status",
    "Store",
    "Unsubscribe",
]


class Status(enum.StrEnum):
    """The status of an effect record."""

    PENDING = "pending"
    """Claimed for a reconcile before a first execution; the function has not run."""
    DISPATCHED = "dispatched"
    """Claimed and handed to the function; a live lease means it is running."""
    COMPLETED = "completed"
    """Applied; the result is kept for the retention."""
    RELEASED = "released"
    """The function raised an exception that means "not applied"; the next call may apply it."""
    UNKNOWN = "unknown"
    """Maybe applied: never expires, never replayed silently."""
    FAILED = "failed"
    """Not applied, and not to be tried again until the retention ends or an operator resolves
    it: the function raised an exception declared terminal (``Record.failure`` holds it), or the
    key was parked because its attempts ran out (``max_attempts``)."""


class ClaimKind(enum.Enum):
    """What a claim found."""

    CLAIMED = "claimed"
    """The caller holds the claim and must execute (status is now DISPATCHED)."""
    COMPLETED = "completed"
    """Already applied; the reply carries the recorded result."""
    IN_FLIGHT = "in_flight"
    """Someone else holds a live lease; the reply carries its remaining time."""
    UNKNOWN = "unknown"
    """Maybe applied, and this caller may neither reconcile nor replay."""
    RECONCILE = "reconcile"
    """The caller holds a lease to ask the remote system (status PENDING or UNKNOWN)."""
    FAILED = "failed"
    """Failed: a recorded terminal exception (``Claim.failure``) to raise again, or, without
    one, a key parked after ``max_attempts``; nothing is to run."""


class ResultState(enum.StrEnum):
    """Whether a completed record holds its result."""

    STORED = ""
    TOO_LARGE = "too_large"
    UNSERIALISABLE = "unserialisable"
    RESOLVED_WITHOUT_RESULT = "resolved_without_result"
    """An operator settled it as applied without giving the result (``effectq resolve --applied``)."""
    WITHHELD = "withheld"
    """Applied, its result kept out of the store on purpose (``redact=effectq.NOTHING``): a replay
    returns ``None``."""


@dataclass(slots=True)
class ClaimRequest:
    """What a caller asks of :meth:`Store.claim` (a value: read it, do not change it).

    Not frozen only because every effect call builds one, and a frozen dataclass
    costs twice as much to build.

    Attributes:
        lease_ms: lease to take, in milliseconds (judged by the store's clock).
        owner: a unique id of this call (``host:pid:n``); a retried claim with
            the same owner gets the same token back instead of a conflict.
        name: the effect name (kept for operators).
        run_id: the run id (kept for operators).
        input_hash: hash of the canonical input, or ``""``; kept to detect
            "same key, different input".
        can_reconcile: on UNKNOWN, hand this caller a reconcile lease.
        replay_safe: on UNKNOWN, re-dispatch to this caller (the remote side dedupes).
        reconcile_first: a fresh claim starts PENDING and replies RECONCILE.
        retention_ms: how long a PENDING or RELEASED record is kept.
        prefetch: on a completed record, also return ``Claim.prefetch_hint`` (what
            the store needs to fetch the run's other completed records at once).
        max_attempts: a grant that would start execution number ``max_attempts + 1``
            parks the record as FAILED instead (0: no cap).
    """

    lease_ms: int
    owner: str
    name: str = ""
    run_id: str = ""
    input_hash: str = ""
    can_reconcile: bool = False
    replay_safe: bool = False
    reconcile_first: bool = False
    retention_ms: int = 7 * 24 * 3600 * 1000
    prefetch: bool = False
    max_attempts: int = 0


@dataclass(slots=True)
class Claim:
    """The reply of :meth:`Store.claim` (a value: read it, do not change it; a store may hand
    the same one to several calls, as a run's prefetch does).

    Not frozen only because every effect call builds one, and a frozen dataclass
    costs twice as much to build.

    Attributes:
        kind: what the claim found.
        token: the fencing token (CLAIMED, RECONCILE; the holder's for the others).
        attempt: how many times the effect was dispatched, this one included.
        status: the record's status after the claim.
        lease_ms: for IN_FLIGHT, the holder's remaining lease.
        result: for COMPLETED, the recorded result bytes (``None`` when not stored).
        result_state: for COMPLETED, whether the result was stored.
        input_hash: the recorded input hash (``""`` when none was recorded).
        error: for UNKNOWN and RECONCILE, why the outcome is unknown.
        owner: the holder (IN_FLIGHT) or last holder (UNKNOWN).
        prefetch_hint: for COMPLETED with ``ClaimRequest.prefetch``: opaque, for
            ``prefetch(run_id, hint)`` (``None`` when the store has nothing to offer).
        failure: for FAILED, the recorded terminal exception (JSON, as the engine gave it to
            :meth:`Store.fail`); ``""`` when the key was parked after ``max_attempts``.
    """

    kind: ClaimKind
    token: int = 0
    attempt: int = 0
    status: Status | None = None
    lease_ms: int = 0
    result: bytes | None = None
    result_state: ResultState = ResultState.STORED
    input_hash: str = ""
    error: str = ""
    owner: str = ""
    prefetch_hint: Any = None
    failure: str = ""


@dataclass(frozen=True, slots=True)
class Record:
    """A whole stored record, for operators and tests.

    Times are the store's clock, in UTC. ``unknown_since`` is when an UNKNOWN
    record became unknown (for one whose holder died, when its lease ran out).
    ``ref`` is where the store keeps it (the Redis key): a completed record may
    keep only a shortened ``key``, so operator primitives address records by it.
    ``failure`` is a FAILED record's recorded terminal exception (JSON; ``""`` when
    the key was parked after ``max_attempts``).
    """

    key: str
    status: Status
    token: int
    attempt: int
    name: str = ""
    run_id: str = ""
    owner: str = ""
    lease_expires_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    error: str = ""
    result: bytes | None = None
    result_state: ResultState = ResultState.STORED
    input_hash: str = ""
    expires_at: datetime | None = None
    unknown_since: datetime | None = None
    ref: str = ""
    failure: str = ""

    @property
    def lease_live(self) -> bool:
        """Whether a lease is held and has not run out (by the reading's clock)."""
        if self.lease_expires_at is None:
            return False
        return self.lease_expires_at > datetime.now(self.lease_expires_at.tzinfo)

    @property
    def in_doubt(self) -> bool:
        """UNKNOWN, or DISPATCHED with a lease that ran out (its holder is gone)."""
        if self.status is Status.UNKNOWN:
            return True
        return self.status is Status.DISPATCHED and not self.lease_live


Unsubscribe = Callable[[], None]


class Prefetched(Protocol):
    """A run's completed records, looked up by effect key: what :meth:`Store.prefetch`
    returns (a ``Mapping[str, Claim]`` is one; a store that keys records otherwise need
    not be able to list the effect keys)."""

    def get(self, key: str) -> Claim | None: ...

    def __len__(self) -> int: ...


OnReply = Callable[[bool | Exception], None]
"""What a pipelined completion's reply becomes: what ``complete`` would have returned, or
the :class:`~effectq.errors.StoreError` it would have raised."""


@runtime_checkable
class Store(Protocol):
    """The primitives every store implements (see :class:`effectq.testing.StoreContract`),
    and the optional capabilities below them, each with the default a store that lacks it
    inherits by subclassing ``Store`` (the engine finds them here, never by probing).
    """

    @property
    def namespace(self) -> str:
        """The namespace every key of this store lives in."""
        ...

    def claim(self, key: str, request: ClaimRequest) -> Claim:
        """Atomically read the record and, when free, claim it."""
        ...

    def complete(
        self,
        key: str,
        token: int,
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool:
        """Record the effect as applied. False: the token no longer holds the record."""
        ...

    def release(self, key: str, token: int, *, error: str, retention_ms: int, ran: bool = True) -> bool:
        """Record "not applied" (PENDING/DISPATCHED → RELEASED), or give back a reconcile lease.
        ``ran=False``: nothing ran under the grant (it is given back), so a DISPATCHED record's
        attempts go back down by one: only executions count."""
        ...

    def mark_unknown(self, key: str, token: int, *, error: str, ran: bool = True) -> bool:
        """Record "maybe applied" (DISPATCHED → UNKNOWN); ``ran=False`` as for :meth:`release`
        (a re-dispatched unknown given back before it ran)."""
        ...

    def fail(self, key: str, token: int, *, error: str, failure: str, retention_ms: int) -> bool:
        """Record a terminal exception (DISPATCHED → FAILED, kept for ``retention_ms``):
        every later claim replies FAILED with ``failure``. False: lost."""
        ...

    def dispatch(
        self, key: str, token: int, *, lease_ms: int, max_attempts: int = 0, retention_ms: int = 0
    ) -> int:
        """PENDING/UNKNOWN held by ``token`` → DISPATCHED. Returns the attempt, 0 when lost,
        -1 when the attempt would be past ``max_attempts`` (0: no cap): then the record is
        parked as FAILED (kept for ``retention_ms``) instead."""
        ...

    def renew(self, key: str, token: int, *, lease_ms: int) -> bool:
        """Extend the lease held by ``token``. False: lost."""
        ...

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
        """Settle a record in doubt (operator); one settled already exactly as asked (the same
        outcome, result and note) is returned unchanged. Raises ResolveRefusedError otherwise."""
        ...

    def get(self, key: str) -> Record | None:
        """The whole record, or None."""
        ...

    def watch(self, key: str, callback: Callable[[], None]) -> Unsubscribe:
        """Call ``callback`` (from any thread) when the record may have left flight.

        Notifications are hints: a waiter re-claims to learn the truth, and bounds
        every wait, so a missed notification costs latency, never correctness.
        """
        ...

    # -- optional capabilities: the defaults say "not supported" ------------------------------

    def prefetch(self, run_id: str, hint: Any = None) -> Prefetched | None:
        """The completed records of a run, by effect key, in one round trip (a redelivered
        run then replays without a round trip per effect). ``hint``: a completed claim's
        ``prefetch_hint``. Default: None, not supported (every call claims)."""
        return None

    def complete_pipelined(
        self,
        key: str,
        token: int,
        on_reply: OnReply,
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool:
        """:meth:`complete`, written now without waiting for its reply; ``on_reply`` gets
        the outcome when the reply is read (by this thread's next command on the store, or
        :meth:`flush_pending`). False: nothing was written, complete the usual way.
        Default: False."""
        return False

    def flush_pending(self) -> None:
        """Read every reply this thread's pipelined completions still owe (a run's end
        calls it, on each store that got one). Default: nothing to read."""
        return None

    def async_store(self) -> AsyncStore | None:
        """This store's primitives for an event loop, sent from the calling loop; None
        where the engine should run the primitives in a worker thread. Default: None."""
        return None


@runtime_checkable
class AsyncStore(Protocol):
    """A store's twin for an event loop (see :meth:`Store.async_store`): ``claim`` and
    ``complete`` as coroutines, ``complete_pipelined`` as a plain call, all on the calling
    loop; ``flush_pending`` reads what the calling task's pipelined completions owe;
    ``prefetch`` hands its round trip, if it needs one, to a worker thread."""

    async def claim(self, key: str, request: ClaimRequest) -> Claim: ...

    async def complete(
        self, key: str, token: int, *, result: bytes | None, result_state: ResultState, retention_ms: int
    ) -> bool: ...

    def complete_pipelined(
        self,
        key: str,
        token: int,
        on_reply: OnReply,
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool: ...

    async def flush_pending(self) -> None: ...

    async def prefetch(self, run_id: str, hint: Any = None) -> Prefetched | None:
        """:meth:`Store.prefetch` from the loop: its I/O, if any, never blocks the loop (a twin
        with nothing to fetch that way hands the store's ``prefetch`` to a worker thread)."""
        ...
