"""Reading records back: one by its effect key, many by their Redis keys (what the indexes list).

Reads change nothing, so they stand apart from the transitions in :mod:`.store`, for
:class:`~effectq.store.redis.RedisStore` to inherit; the operator listings of :mod:`.admin`
read through :meth:`RecordReads.read_records`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..base import Record, Status
from .errors import raise_failure
from .replies import decode_read, when

if TYPE_CHECKING:
    import redis as _redis

__all__ = ["RecordReads"]


class RecordReads:
    """``get`` and ``read_records``, for :class:`~effectq.store.redis.RedisStore` to inherit."""

    _client: _redis.Redis | _redis.RedisCluster
    _scripts: dict[str, Any]

    if TYPE_CHECKING:  # what the store has

        def _keys(self, key: str) -> list[str]: ...

        def _run(self, name: str, key: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

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
