"""The Redis store: :class:`RedisStore` (:mod:`.store`), its scripts and their sending
(:mod:`.scripts`, from an event loop :mod:`.aio_store`), its key layout (:mod:`.layout`), operator
calls (:mod:`.admin`), reply codes (:mod:`.replies`), the one translation of redis-py's errors
(:mod:`.errors`), Cluster, Sentinel, replicas, notifications, and the pipelined wire (:mod:`.wire`)."""

from __future__ import annotations

from . import scripts as _scripts
from .store import RedisStore

_SCRIPTS = _scripts.SCRIPTS  # effectq.doctor checks the scripts Redis holds
_lua = _scripts.lua

__all__ = ["RedisStore"]
