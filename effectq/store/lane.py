"""Old path of :mod:`effectq.store.redis.wire.sync`, kept so existing imports work."""

from .redis.wire.frames import SignalSafePacker
from .redis.wire.redispy import protect_pool, protected_pool_class
from .redis.wire.sync import Lane, lane_for
from .redis.wire.sync import flush_pending as settle_owed_replies

__all__ = [
    "Lane",
    "SignalSafePacker",
    "lane_for",
    "protect_pool",
    "protected_pool_class",
    "settle_owed_replies",
]
