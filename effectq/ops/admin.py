"""Operator actions: what ``effectq list``, ``show``, ``resolve``, ``stats`` and ``purge`` do.

Built on the operator primitives of a store (:class:`~effectq.store.OperatorStore`),
so the command line, a dashboard or a script of your own see the same thing:

    from effectq.ops import admin

    for entry in admin.list_records(store, standings={Standing.UNKNOWN}):
        print(entry.record.key, entry.record.error)

Listing what is in doubt or in flight reads only the store's indexes;
completed and released records, and filters the indexes cannot answer, need a
scan of the namespace. Every time is the store's clock, which also judges leases.
"""

from __future__ import annotations

import getpass
import json
import logging
import socket
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..errors import ConfigurationError, ResolveRefusedError
from ..store.base import Record, ResultState, Store
from ..store.operators import OperatorStore, Standing, since, standing

__all__ = [
    "DEFAULT_RETENTION",
    "INDEXED",
    "Entry",
    "PurgeReport",
    "Stats",
    "list_records",
    "operator_store",
    "purge",
    "resolve",
    "stats",
]

log_resolve = logging.getLogger("effectq.resolve")
log_purge = logging.getLogger("effectq.purge")

INDEXED = frozenset({Standing.UNKNOWN, Standing.IN_FLIGHT})
"""What the stores index: listing only these never scans."""
DEFAULT_RETENTION = timedelta(days=7)
"""How long a record settled by ``resolve`` is kept (the effects' default retention)."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One listed record.

    Attributes:
        record: the record.
        standing: where it stands.
        since: since when it has stood there (see :func:`effectq.store.operators.since`).
        now: the store's clock when it was listed.
    """

    record: Record
    standing: Standing
    since: datetime | None
    now: datetime

    @property
    def age(self) -> float | None:
        """Seconds it has stood where it stands."""
        return None if self.since is None else max(0.0, (self.now - self.since).total_seconds())


def operator_store(store: Store) -> OperatorStore:
    """``store`` as an operator store, or a ConfigurationError saying it is not one."""
    if not isinstance(store, OperatorStore):
        raise ConfigurationError(
            f"{type(store).__name__} has no operator primitives (in_doubt, scan, purge, ...); "
            f"see effectq.store.OperatorStore"
        )
    return store


def _entries(store: OperatorStore, records: Iterable[Record], now: datetime) -> Iterator[Entry]:
    for record in records:
        where = standing(record, now)
        yield Entry(record, where, since(record, where), now)


def list_records(
    store: Store,
    *,
    standings: Collection[Standing] = INDEXED,
    run_id: str | None = None,
    name: str | None = None,
    older_than: float | timedelta = 0.0,
    limit: int | None = None,
) -> Iterator[Entry]:
    """Records that stand in ``standings``, filtered by run, effect name and age.

    Unknown and in-flight come from the indexes, the longest in doubt first, then
    the soonest lease end; any other standing scans the namespace (unordered; a
    limit stops the scan early).

    Args:
        store: an operator store.
        standings: which standings to list.
        run_id: only records of this run.
        name: only records of this effect.
        older_than: only records that have stood where they stand this long (seconds).
        limit: at most this many.
    """
    ops = operator_store(store)
    wanted = frozenset(standings)
    age = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
    now = ops.clock()
    filtered = run_id is not None or name is not None or age > 0
    cap = None if filtered else limit
    if wanted <= INDEXED:
        records: Iterable[Record] = (
            *(ops.in_doubt(limit=cap) if Standing.UNKNOWN in wanted else ()),
            *(ops.in_flight(limit=cap) if Standing.IN_FLIGHT in wanted else ()),
        )
    else:
        records = ops.scan()
    count = 0
    for entry in _entries(ops, records, now):
        if limit is not None and count >= limit:
            return
        record = entry.record
        if entry.standing not in wanted:
            continue
        if (run_id is not None and record.run_id != run_id) or (name is not None and record.name != name):
            continue
        if age > 0 and (entry.age is None or entry.age < age):
            continue
        count += 1
        yield entry


@dataclass(slots=True)
class Stats:
    """Counts by standing and by effect name.

    Attributes:
        namespace: the namespace counted.
        now: the store's clock.
        counts: records per standing (completed and released only when scanned).
        by_name: the same, per effect name.
        oldest_unknown: since when the oldest record in doubt has been in doubt.
        oldest_by_name: the same, per effect name.
        scanned: whether every record was read (False: completed/released not counted).
    """

    namespace: str
    now: datetime
    counts: Counter[Standing] = field(default_factory=Counter)
    by_name: dict[str, Counter[Standing]] = field(default_factory=dict)
    oldest_unknown: datetime | None = None
    oldest_by_name: dict[str, datetime] = field(default_factory=dict)
    scanned: bool = False

    @property
    def oldest_unknown_age(self) -> float | None:
        """Seconds the oldest record in doubt has been in doubt."""
        if self.oldest_unknown is None:
            return None
        return max(0.0, (self.now - self.oldest_unknown).total_seconds())

    def add(self, entry: Entry) -> None:
        name = entry.record.name or "?"
        self.counts[entry.standing] += 1
        self.by_name.setdefault(name, Counter())[entry.standing] += 1
        if entry.standing is Standing.UNKNOWN and entry.since is not None:
            if self.oldest_unknown is None or entry.since < self.oldest_unknown:
                self.oldest_unknown = entry.since
            if name not in self.oldest_by_name or entry.since < self.oldest_by_name[name]:
                self.oldest_by_name[name] = entry.since


def stats(store: Store, *, scan: bool = True) -> Stats:
    """Counts by standing and effect name, and the oldest doubt.

    With ``scan=False`` only the indexes are read (unknown and in flight): cheap
    on any size of namespace.
    """
    ops = operator_store(store)
    now = ops.clock()
    found = Stats(namespace=ops.namespace, now=now, scanned=scan)
    records = ops.scan() if scan else (*ops.in_doubt(), *ops.in_flight())
    for entry in _entries(ops, records, now):
        found.add(entry)
    return found


@dataclass(slots=True)
class PurgeReport:
    """What a purge did (or, dry, would do).

    Attributes:
        deleted: records deleted (dry: that would be).
        by_standing: of those, how many were completed and released.
        kept: records that matched but stand in doubt or in flight, so were kept.
        changed: records that changed between the scan and their delete, so were kept.
        pruned: index entries of records already gone, dropped.
        dry_run: nothing was deleted.
    """

    deleted: int = 0
    by_standing: Counter[Standing] = field(default_factory=Counter)
    kept: Counter[Standing] = field(default_factory=Counter)
    changed: int = 0
    pruned: int = 0
    dry_run: bool = False


def purge(
    store: Store,
    *,
    run_id: str | None = None,
    older_than: float | timedelta | None = None,
    dry_run: bool = False,
) -> PurgeReport:
    """Delete the settled records (completed, released) of a run, or older than an age.

    Never a record in doubt or in flight: those are counted in ``kept``. Each
    delete re-checks its conditions atomically, so a record claimed again since
    the scan survives. A purged completed key applies again on its next call.

    Args:
        store: an operator store.
        run_id: only this run's records.
        older_than: only records unchanged for this long (seconds or timedelta).
        dry_run: count, delete nothing.
    """
    if run_id is None and older_than is None:
        raise ConfigurationError(
            "purge needs a run id or an age (older_than), so it never empties a namespace"
        )
    ops = operator_store(store)
    age_ms = 0
    if older_than is not None:
        seconds = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
        age_ms = max(1, int(seconds * 1000))
    report = PurgeReport(dry_run=dry_run)
    settled = (Standing.COMPLETED, Standing.RELEASED, Standing.FAILED)
    for entry in list_records(ops, standings=set(Standing), run_id=run_id, older_than=age_ms / 1000):
        if entry.standing not in settled:
            report.kept[entry.standing] += 1
        elif dry_run or ops.purge(entry.record, run_id=run_id or "", older_than_ms=age_ms):
            report.deleted += 1
            report.by_standing[entry.standing] += 1
        else:
            report.changed += 1
    if not dry_run:
        report.pruned = ops.prune_indexes()
    log_purge.info(
        "effectq purge run=%s older_than_ms=%s dry_run=%s: deleted %d, kept %d in doubt or in flight",
        run_id,
        age_ms,
        dry_run,
        report.deleted,
        sum(report.kept.values()),
    )
    return report


def default_note() -> str:
    """Who settles, for the record: ``user@host``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (containers)
        user = "?"
    return f"{user}@{socket.gethostname()}"


def resolve(
    store: Store,
    key: str,
    *,
    applied: bool,
    result: str | None = None,
    note: str = "",
    retention: float | timedelta = DEFAULT_RETENTION,
) -> tuple[Record | None, Record]:
    """Settle a record in doubt; compare-and-set, so of two resolvers exactly one wins.

    The same decision again (the same outcome, result and note: a resolve resent after its
    reply was lost, or run again) finds the record settled as it asks, and reports it.

    Args:
        store: the store.
        key: the effect key.
        applied: the effect applied (replay from now on) or not (the next call applies it).
        result: for ``applied``, the result as JSON text, replayed to later calls;
            without it they get :class:`~effectq.errors.ResultNotRecordedError`.
        note: who settles and why, kept on the record.
        retention: how long the settled record is kept.

    Returns:
        The record before (as read just before; ``None`` if none) and after.

    Raises:
        ResolveRefusedError: the record is not in doubt (completed, released, in flight) nor
            settled as asked, or is gone.
        ConfigurationError: ``result`` is not JSON, or is given with ``applied=False``.
    """
    payload: bytes | None = None
    if result is not None:
        if not applied:
            raise ConfigurationError("a result only goes with --applied")
        try:
            payload = json.dumps(json.loads(result), separators=(",", ":"), ensure_ascii=False).encode()
        except ValueError as exc:
            raise ConfigurationError(f"the result is not JSON: {exc}") from exc
    state = ResultState.STORED if payload is not None or not applied else ResultState.RESOLVED_WITHOUT_RESULT
    seconds = retention.total_seconds() if isinstance(retention, timedelta) else float(retention)
    before = store.get(key)
    text = f"resolved {'applied' if applied else 'not applied'} by {note or default_note()}"
    try:
        after = store.resolve(
            key,
            applied=applied,
            result=payload,
            result_state=state,
            note=text,
            retention_ms=int(seconds * 1000),
        )
    except ResolveRefusedError as exc:
        log_resolve.info("effectq resolve %s refused: %s", key, exc)
        raise
    log_resolve.info(
        "effectq resolve %s (%s): %s; was %s (%s)",
        key,
        after.name,
        text,
        before.status.value if before else "?",
        before.error if before else "",
    )
    return before, after
