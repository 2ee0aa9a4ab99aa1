"""Old path of :mod:`effectq.store.redis.cluster`, kept so existing imports work."""

from .redis.cluster import check_cluster, cluster_from_url, is_cluster, is_cluster_url, seed_nodes

__all__ = ["check_cluster", "cluster_from_url", "is_cluster", "is_cluster_url", "seed_nodes"]
