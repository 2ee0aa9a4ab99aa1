"""A redelivered task with N completed effects: round trips and time to resume.

The task ran N effects, then "died"; the broker redelivers it and it calls the
same N effects again. Each is already completed, so each must replay. With
the run's prefetch (the default), the first replay's reply brings the run's
other completed records: one round trip (past the claim's bound of 64 records
or 256 KiB, one MGET more brings the rest). Without it (measured side by side
by turning it off for the run), each replay is one claim: N.

    python bench/redelivery.py [--sizes 1 10 100] [--repeat 20] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import redis

import effectq

try:
    from common import RoundTrips, percentile, redis_server, table
except ImportError:  # imported as bench.redelivery
    from .common import RoundTrips, percentile, redis_server, table


def measure(url: str, sizes: list[int], repeat: int) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    namespace = f"bench-r-{uuid.uuid4().hex[:8]}"
    store = effectq.RedisStore(client, namespace=namespace)

    @effectq.effect(name="bench.step")
    def step(i: int) -> dict[str, int]:
        return {"step": i}

    results = []
    for n in sizes:
        row: dict[str, Any] = {"n": n}
        for mode in ("prefetch", "one by one"):
            times, trips = [], []
            for _ in range(repeat):
                run_id = f"task-{uuid.uuid4().hex}"
                with effectq.run(run_id, store=store):
                    for i in range(n):
                        step(i)
                with RoundTrips() as counter:
                    began = time.perf_counter()
                    with effectq.run(run_id, store=store) as again:
                        if mode == "one by one":
                            again.prefetch_tried = True
                        for i in range(n):
                            step(i)
                    times.append(time.perf_counter() - began)
                trips.append(counter.count)
                assert again.stats.replayed == n and again.stats.executed == 0
            row[mode] = {"ms": percentile(times, 50) * 1000, "trips": percentile(trips, 50)}
        results.append(row)
    for key in client.scan_iter(match=f"effectq:{{{namespace}*", count=1000):
        client.delete(key)
    return results


def report(results: list[dict[str, Any]]) -> str:
    rows = [
        (
            r["n"],
            int(r["prefetch"]["trips"]),
            r["prefetch"]["ms"],
            int(r["one by one"]["trips"]),
            r["one by one"]["ms"],
            r["one by one"]["ms"] / r["prefetch"]["ms"],
        )
        for r in results
    ]
    return "\n".join(
        [
            "### A redelivered task resuming N completed effects (median)",
            "",
            table(
                ["N", "round trips", "ms to resume", "round trips, one by one", "ms, one by one", "speed-up"],
                rows,
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    with redis_server(args.redis_url) as url:
        print(report(measure(url, args.sizes, args.repeat)))


if __name__ == "__main__":
    main()
