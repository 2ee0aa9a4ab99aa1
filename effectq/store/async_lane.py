"""Old path of :mod:`effectq.store.redis.wire.aio`, kept so existing imports work."""

from .redis.wire.aio import AsyncLane, async_lane_for
from .redis.wire.aio import flush_pending as settle_owed_async

__all__ = ["AsyncLane", "async_lane_for", "settle_owed_async"]
