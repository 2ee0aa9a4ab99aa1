"""Old path of :mod:`effectq.store.redis.sentinel`, kept so existing imports work."""

from .redis.sentinel import SentinelLane, is_sentinel_url, sentinel_from_url, split_sentinel_url

__all__ = ["SentinelLane", "is_sentinel_url", "sentinel_from_url", "split_sentinel_url"]
