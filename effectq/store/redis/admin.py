"""The operator primitives of :class:`~effectq.store.redis.RedisStore` (see :mod:`effectq.store.operators`).

In doubt and in flight come from the two indexes the scripts keep in every
bucket of a namespace (``effectq:{ns:bb}:open`` and ``effectq:{ns:bb}:doubt``),
never from a scan:

- in doubt = the doubt index, plus the open entries whose lease end is past and
  whose record is still dispatched (a dead holder nobody has called since);
- in flight = the open entries whose lease end is still ahead.

Redis Cluster: the 256 buckets of a namespace hash to 256 slots, so no command
spans two buckets. These primitives send one command per bucket and index in
one pipeline, which redis-py's cluster pipeline splits by node; records are
fetched by their own keys the same way; ``scan`` walks every primary
(``SCAN MATCH effectq:{ns:*``, indexes skipped, which ``RedisCluster.scan_iter``
runs on each primary in turn); and ``purge`` is one script call per record,
whose keys share the record's slot. Nothing here needs a cross-slot command.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from ...errors import CorruptRecordError, StoreError
from ..base import Record, Status
from ..operators import Standing, Summary, since, standing
from .errors import raise_operator_failure

__all__ = ["RedisOperations"]

log = logging.getLogger("effectq.list")
log_purge = logging.getLogger("effectq.purge")

_RECORD = re.compile(r":[0-9a-f]{32}")
"""What follows the hash tag in a record's key (not an index, not a run's index of completed records)."""
FETCH_BATCH = 200
"""Records read per pipeline round trip."""
SCAN_COUNT = 1000
"""The COUNT hint of each SCAN step."""


class _Host(Protocol):
    """What the operator primitives use of the store they are mixed into."""

    @property
    def client(self) -> Any: ...

    @property
    def namespace(self) -> str: ...

    _prefix: str

    def bucket_keys(self) -> Iterator[tuple[str, str]]: ...

    def record_key(self, key: str) -> str: ...

    def _run(self, name: str, key: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

    _scripts: dict[str, Any]

    def _decode_read(self, key: str, reply: Any) -> Record | None: ...

    def clock(self) -> datetime: ...

    def _per_bucket(self, queue: Callable[[Any, str, str], None]) -> list[list[Any]]: ...

    def _fetch(self, record_keys: Iterable[str]) -> Iterator[Record]: ...
    def _read_batch(self, script: Any, batch: list[str]) -> list[Any]: ...
    @property
    def clustered(self) -> bool: ...


def _ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _indexes(record_key: str) -> tuple[str, str]:
    tag = record_key.rsplit(":", 1)[0]
    return f"{tag}:open", f"{tag}:doubt"


def _when(score: Any) -> datetime | None:
    return None if score is None else datetime.fromtimestamp(float(score) / 1000, UTC)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisOperations:
    """Mixed into RedisStore: listing, summary and purge over the per-bucket indexes."""

    def clock(self: _Host) -> datetime:
        try:
            seconds, micros = self.client.time()
        except Exception as exc:
            raise_operator_failure("clock", exc)
        return datetime.fromtimestamp(seconds + micros / 1e6, UTC)

    def _per_bucket(self: _Host, queue: Callable[[Any, str, str], None]) -> list[list[Any]]:
        """Queue ``queue(pipe, open_key, unknown_key)`` for every bucket; one pipeline, results per bucket."""
        pipe = self.client.pipeline(transaction=False)
        sizes = []
        for open_key, unknown_key in self.bucket_keys():
            before = len(pipe)
            queue(pipe, open_key, unknown_key)
            sizes.append(len(pipe) - before)
        try:
            replies = pipe.execute()
        except Exception as exc:
            raise_operator_failure("index read", exc)
        out, at = [], 0
        for size in sizes:
            out.append(replies[at : at + size])
            at += size
        return out

    def _fetch(self: _Host, record_keys: Iterable[str]) -> Iterator[Record]:
        """The records at these Redis keys, in order; gone ones are skipped, corrupt ones logged."""
        script = self._scripts["read"]
        batch: list[str] = []
        for record_key in (*record_keys, None):
            if record_key is not None:
                batch.append(record_key)
                if len(batch) < FETCH_BATCH:
                    continue
            if not batch:
                break
            try:
                replies = self._read_batch(script, batch)
            except Exception as exc:
                raise_operator_failure("fetch", exc)
            for i, name in enumerate(batch):
                reply, score = replies[2 * i], replies[2 * i + 1]
                try:
                    record = self._decode_read("", reply)
                except CorruptRecordError as exc:
                    log.warning("effectq list skipped corrupt record %s: %s", name, exc.detail)
                    continue
                if record is not None:
                    since = _when(score) if record.status is Status.UNKNOWN else None
                    yield replace(record, ref=name, unknown_since=since)
            batch = []

    def _read_batch(self: _Host, script: Any, batch: list[str]) -> list[Any]:
        """read.lua and the doubt score of each record, in one pipeline.

        redis-py's cluster pipeline refuses ``evalsha()`` but routes the raw command
        by its key; it does not load a missing script either, so a NOSCRIPT loads it
        (on every primary) and the batch runs again.
        """
        from redis.exceptions import NoScriptError

        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for name in batch:
                if self.clustered:
                    pipe.execute_command("EVALSHA", script.sha, 1, name)
                else:
                    script(keys=[name], args=[], client=pipe)
                pipe.zscore(_indexes(name)[1], name)
            replies: list[Any] = pipe.execute(raise_on_error=False)
            errors = [reply for reply in replies if isinstance(reply, Exception)]
            if errors and attempt == 1 and all(isinstance(error, NoScriptError) for error in errors):
                self.client.script_load(script.script)
                continue
            if errors:
                raise errors[0]
            break
        return replies

    def in_doubt(self: _Host, *, limit: int | None = None) -> Iterator[Record]:
        now = self.clock()
        now_ms = _ms(now)
        stop = -1 if limit is None else max(limit, 1) - 1

        def queue(pipe: Any, open_key: str, unknown_key: str) -> None:
            pipe.zrange(unknown_key, 0, stop, withscores=True)
            pipe.zrangebyscore(open_key, "-inf", now_ms, withscores=True)

        candidates = sorted(
            (score, _text(member))
            for doubt, dead in self._per_bucket(queue)
            for member, score in (*doubt, *dead)
        )
        found = sorted(
            (
                record
                for record in self._fetch(name for _, name in candidates)
                if standing(record, now) is Standing.UNKNOWN
            ),
            key=lambda record: since(record, Standing.UNKNOWN) or now,
        )
        yield from found if limit is None else found[:limit]

    def in_flight(self: _Host, *, limit: int | None = None) -> Iterator[Record]:
        now = self.clock()
        now_ms = _ms(now)
        window = {} if limit is None else {"start": 0, "num": max(limit, 1)}

        def queue(pipe: Any, open_key: str, unknown_key: str) -> None:
            pipe.zrangebyscore(open_key, f"({now_ms}", "+inf", withscores=True, **window)

        candidates = sorted(
            (score, _text(member)) for (live,) in self._per_bucket(queue) for member, score in live
        )
        if limit is not None:
            candidates = candidates[:limit]
        for record in self._fetch(name for _, name in candidates):
            if standing(record, now) is Standing.IN_FLIGHT:
                yield record

    def scan(self: _Host) -> Iterator[Record]:
        pattern = f"{self._prefix}:{{{self.namespace}:*"
        try:
            names = (_text(name) for name in self.client.scan_iter(match=pattern, count=SCAN_COUNT))
            yield from self._fetch(name for name in names if _RECORD.fullmatch(name.rsplit("}", 1)[-1]))
        except StoreError:
            raise
        except Exception as exc:
            raise_operator_failure("scan", exc)

    def summary(self: _Host) -> Summary:
        now_ms = _ms(self.clock())

        def queue(pipe: Any, open_key: str, unknown_key: str) -> None:
            pipe.zcard(unknown_key)
            pipe.zrange(unknown_key, 0, 0, withscores=True)
            pipe.zrangebyscore(open_key, "-inf", now_ms, withscores=True)
            pipe.zcount(open_key, f"({now_ms}", "+inf")

        unknown = in_flight = 0
        oldest: float | None = None
        dead: list[tuple[str, float]] = []
        for count, first, expired, live in self._per_bucket(queue):
            unknown += count
            in_flight += live
            if first and (oldest is None or first[0][1] < oldest):
                oldest = first[0][1]
            dead.extend((_text(member), score) for member, score in expired)
        if dead:  # open entries past their lease: dead holders, or pending records nobody ran
            pipe = self.client.pipeline(transaction=False)
            for name, _ in dead:
                pipe.hget(name, "s")
            try:
                statuses = pipe.execute(raise_on_error=False)  # a completed record is a string
            except Exception as exc:
                raise_operator_failure("summary", exc)
            for (_, score), status in zip(dead, statuses, strict=True):
                if status == b"d":
                    unknown += 1
                    oldest = score if oldest is None else min(oldest, score)
        when = datetime.fromtimestamp(oldest / 1000, UTC) if oldest is not None else None
        return Summary(in_doubt=unknown, oldest_in_doubt=when, in_flight=in_flight)

    def purge(self: _Host, record: Record, *, run_id: str = "", older_than_ms: int = 0) -> bool:
        record_key = record.ref or self.record_key(record.key)
        code, status = self._run(
            "purge", record.key, [record_key, *_indexes(record_key)], [run_id, older_than_ms]
        )
        if int(code) < 0:
            raise CorruptRecordError(record.key, f"the Redis key holds {_text(status)}")
        if int(code) == 1:
            log_purge.info("effectq purge %s (was %s)", record.key, _text(status))
            return True
        return False

    def prune_indexes(self: _Host) -> int:
        def queue(pipe: Any, open_key: str, unknown_key: str) -> None:
            pipe.zrange(open_key, 0, -1)
            pipe.zrange(unknown_key, 0, -1)

        names = sorted({_text(m) for lists in self._per_bucket(queue) for members in lists for m in members})
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.exists(name)
        try:
            exists = pipe.execute() if names else []
        except Exception as exc:
            raise_operator_failure("prune", exc)
        pruned = 0
        for name, present in zip(names, exists, strict=True):
            if present:
                continue
            code, _ = self._run("purge", name, [name, *_indexes(name)], ["", 0])
            pruned += int(code) == 2
        if pruned:
            log_purge.info("effectq purge dropped %d index entries whose record was gone", pruned)
        return pruned
