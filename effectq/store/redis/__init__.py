"""The Redis store: :class:`RedisStore` (:mod:`.store`), its key layout (:mod:`.layout`), operator
calls (:mod:`.admin`), reply codes (:mod:`.replies`), the one translation of redis-py's errors
(:mod:`.errors`), Cluster, Sentinel, replicas, notifications, and the pipelined wire (:mod:`.wire`)."""

from __future__ import annotations

from .store import _SCRIPTS as _SCRIPTS  # effectq.doctor checks the scripts Redis holds
from .store import RedisStore
from .store import _lua as _lua

__all__ = ["RedisStore"]
