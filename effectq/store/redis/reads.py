"""Reading records back: one by its effect key, many by their Redis keys (what the indexes list),
a run's completed records at once (a redelivery's prefetch).

Reads change nothing, so they stand apart from the transitions in :mod:`.store`, for
:class:`~effectq.store.redis.RedisStore` to inherit; the operator listings of :mod:`.admin`
read through :meth:`RecordReads.read_records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..base import Claim, Record, Status
from .errors import raise_failure
from .replies import Prefetched, decode_read, packed_claim, when

if TYPE_CHECKING:
    import redis as _redis

__all__ = ["RecordReads"]


class RecordReads:
    """``get``, ``read_records`` and ``prefetch``, for :class:`~effectq.store.redis.RedisStore` to inherit."""

    _client: _redis.Redis | _redis.RedisCluster
    _scripts: dict[str, Any]

    if TYPE_CHECKING:  # what the store has

        def _keys(self, key: str) -> tuple[str, ...]: ...

        def _run(self, name: str, key: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

        def _run_bucket(self, run_id: str) -> tuple[str, str, str, str]: ...

        def record_key(self, key: str) -> str: ...

    def get(self, key: str) -> Record | None:
        record_key, _, unknown_key = self._keys(key)
        reply = self._run("read", key, [record_key], [])
        record = self._decode_read(key, reply)
        if record is None:
            return None
        since = None
        if record.status is Status.UNKNOWN:
            try:
                since = when(self._client.zscore(unknown_key, record_key))
            except Exception as exc:
                raise_failure("get", key, exc)
        return replace(record, unknown_since=since, ref=record_key)

    def read_records(self, record_keys: Sequence[str]) -> list[Record | None]:
        """Records by their Redis keys (as the indexes list them), in one pipelined round trip.

        A record whose key cannot be recomputed (a completed default key keeps only
        16 hex of its input hash) gets ``key`` ending in ``…``.
        """
        script = self._scripts["read"]
        try:
            pipe = self._client.pipeline(transaction=False)
            for record_key in record_keys:
                script(keys=[record_key], args=[], client=pipe)
            replies = pipe.execute()
        except Exception as exc:
            raise_failure("read", ",".join(record_keys[:3]), exc)
        return [self._decode_read("", reply) for reply in replies]

    def _decode_read(self, key: str, reply: Any) -> Record | None:
        return decode_read(key, reply)

    def prefetch(self, run_id: str, hint: Any = None) -> Prefetched:
        """The completed records of a run, found by effect key; no round trip for a run within
        the claim's bound, one otherwise.

        The run's index (kept by complete.lua for default-shaped keys) lists the
        records. ``hint`` is what a completed claim returned (claim.lua's PREFETCHED
        reply): the index and the values of its first entries, up to a bound; one MGET
        reads the entries past them. Without a hint the index is read first. Other keys
        are not indexed: they are claimed as usual.
        """
        found = self._prefetched(run_id, hint)
        if found is not None:
            return found
        index, tag, _, _ = self._run_bucket(run_id)
        try:
            if isinstance(hint, list) and hint:
                raw, values = hint[0], hint[1:]
            else:
                raw, values = self._client.get(index), []
            record_keys = _record_keys(tag, raw)
            if _more(record_keys, values):  # past what the claim brought: the rest at once
                values = [*values, *self._client.mget(record_keys[len(values) :])]
        except Exception as exc:
            raise_failure("prefetch", run_id, exc)
        return self._found(record_keys, values)

    def _prefetched(self, run_id: str, hint: Any) -> Prefetched | None:
        """:meth:`prefetch` where ``hint`` brought every record its index lists (no round trip);
        None where the records need one (the index to read, or records past the claim's bound).
        The event loop reads the first here, and only hops to a thread for the second."""
        if not isinstance(hint, list) or not hint:
            return None
        record_keys = _record_keys(self._run_bucket(run_id)[1], hint[0])
        values = hint[1:]
        if _more(record_keys, values):
            return None
        return self._found(record_keys, values)

    def _found(self, record_keys: list[str], values: list[Any]) -> Prefetched:
        found: dict[str, Claim] = {}
        for record_key, value in zip(record_keys, values, strict=False):
            claim = packed_claim(value) if isinstance(value, bytes) else None
            if claim is not None:
                found[record_key] = claim
        return Prefetched(self.record_key, found)


def _more(record_keys: list[str], values: list[Any]) -> bool:
    """Whether the index lists records past the values in hand (a run of one lists only itself)."""
    return len(values) < len(record_keys) > 1


def _record_keys(tag: str, index: Any) -> list[str]:
    """The record keys a run's index lists (16 bytes a record: the digest)."""
    raw = index if isinstance(index, bytes) else b""
    return [f"{tag}:{raw[i : i + 16].hex()}" for i in range(0, len(raw) - 15, 16)]
