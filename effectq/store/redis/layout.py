"""Where a namespace's records live in Redis: the keys of one effect, its bucket, its run.

Layout of one namespace (``ns``); ``bb`` is the first byte of the key's digest,
so a namespace spreads over 256 hash slots and every script touches one::

    effectq:{ns:bb}:<digest>   one effect record: a hash while in flight, released or
                               unknown; one packed string once completed (compact: it
                               is kept for the retention)
    effectq:{ns:bb}:open       zset: pending/dispatched records by lease end
    effectq:{ns:bb}:doubt      zset: unknown records by when they became unknown
    effectq:{ns:bb}:run:<d>    a run's index of its completed records (default-shaped keys)
    effectq:{ns}:notify        pub/sub channel: a record left flight (only when waited on)
    effectq:{ns:bb}:notify     the same, one sharded channel per bucket, on Redis Cluster
"""

from __future__ import annotations

from collections.abc import Iterator

from ...keys import sha256, split_default_key

__all__ = ["KeyLayout", "Layout"]


class KeyLayout:
    """The key layout of one namespace, for :class:`~effectq.store.redis.RedisStore` to inherit."""

    _namespace: str
    _prefix: str

    def _init_layout(self, namespace: str, prefix: str, *, sharded: bool) -> None:
        self._namespace = namespace
        self._digest_prefix = f"{namespace}\x00".encode()  # what key_digest hashes first
        self._prefix = prefix
        self._layout_sharded = sharded
        self._namespace_channel = f"{prefix}:{{{namespace}}}:notify"
        self._layouts: dict[str, Layout] = {}
        self._runs: dict[str, tuple[str, str, str, str]] = {}
        self._buckets: dict[str, tuple[str, str, str]] = {}

    def channels(self) -> list[str]:
        """Every notification channel of the namespace: one, or on Cluster one per bucket."""
        if self._layout_sharded:
            return [f"{self._tag(f'{b:02x}')}:notify" for b in range(256)]
        return [self._namespace_channel]

    def _tag(self, digest: str) -> str:
        return f"{self._prefix}:{{{self._namespace}:{digest[:2]}}}"

    def _bucket(self, digest: str) -> tuple[str, str, str]:
        """(tag, open index, unknown index) of the bucket of ``digest`` (a hex digest); each of the
        256 is written once, then looked up."""
        found = self._buckets.get(digest[:2])
        if found is None:
            tag = self._tag(digest)
            found = self._buckets[digest[:2]] = (tag, f"{tag}:open", f"{tag}:doubt")
        return found

    def record_key(self, key: str) -> str:
        """The Redis key of an effect key's record."""
        return self._layout_of(key).script_keys[0]

    def _keys(self, key: str) -> tuple[str, ...]:
        """(record, open index, unknown index) of a key."""
        return self._layout_of(key).script_keys[:3]

    def _layout_of(self, key: str) -> Layout:
        """Where a key's record lives; remembered, since one call asks more than once.

        A key shaped like a default key (``run id:name:<sha256 hex>``) lives in its
        run's bucket, beside the run's index of completed records, so a redelivered
        run can fetch them all at once; any other key in its own bucket. The rule
        reads the key alone, so an operator holding only the key finds the record.
        """
        layouts = self._layouts
        layout = layouts.get(key)
        if layout is None:
            if len(layouts) >= 4096:
                layouts.clear()
            head = sha256(self._digest_prefix + key.encode()).digest()[:16]  # key_digest's bytes
            digest = head.hex()
            parts = split_default_key(key)
            if parts is None:
                tag, open_key, unknown_key = self._bucket(digest)
                layout = Layout((f"{tag}:{digest}", open_key, unknown_key), head)
            else:
                index, tag, open_key, unknown_key = self._run_bucket(parts[0])
                layout = Layout((f"{tag}:{digest}", open_key, unknown_key, index), head)
            layouts[key] = layout
        return layout

    def _run_bucket(self, run_id: str) -> tuple[str, str, str, str]:
        """(the run's index, its bucket's tag, open index and unknown index); remembered per run."""
        found = self._runs.get(run_id)
        if found is None:
            if len(self._runs) >= 1024:
                self._runs.clear()
            run_digest = sha256(self._digest_prefix + run_id.encode()).hexdigest()  # key_digest's
            tag, open_key, unknown_key = self._bucket(run_digest)
            found = self._runs[run_id] = (f"{tag}:run:{run_digest[2:34]}", tag, open_key, unknown_key)
        return found

    def _channel(self, record_key: str) -> str:
        """Where a record's notifications go: the namespace's channel, or on Cluster its bucket's."""
        if self._layout_sharded:
            return record_key.rsplit(":", 1)[0] + ":notify"
        return self._namespace_channel

    def bucket_keys(self) -> Iterator[tuple[str, str]]:
        """Every (open index, unknown index) pair of this namespace, one per bucket."""
        for b in range(256):
            tag = self._tag(f"{b:02x}")
            yield f"{tag}:open", f"{tag}:doubt"


class Layout:
    """The Redis keys of one effect key: a tuple of strings, which the garbage collector stops
    tracking (a worker remembers thousands of layouts; lists would all be traversed)."""

    __slots__ = ("digest", "script_keys")

    def __init__(self, script_keys: tuple[str, ...], digest: bytes) -> None:
        self.script_keys = script_keys
        """What claim and complete take: the record, its bucket's open and unknown indexes, and for
        a default-shaped key its run's index (the other scripts take the first two or three)."""
        self.digest = digest
