"""Redis deployments of several servers: Cluster, replicas, Sentinel (each test starts its own)."""
