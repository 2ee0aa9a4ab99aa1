"""What waiting for replicas costs: round trips and latency of an effect call, per deployment.

    python bench/replicas.py            # 2000 calls per case (about a minute)
    python bench/replicas.py --calls 200

Starts its own servers on free loopback ports (a primary with a replica, and a
3+3 Redis Cluster; the suite's helpers in tests/support/servers.py) and stops them. For
each deployment it times first-time effects (claim, function, complete) and
replays (claim), and counts round trips as the requests the client sent (a
pipeline is one). The last case holds the replica's link, to show what a
lagging replica costs: a claim that must run waits the full timeout and raises,
a replay pays the timeout too (WAIT is pipelined, so it is sent either way).

Figures from a shared 2-core machine over loopback are for comparison between
rows, not for capacity planning.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import effectq
from tests.support import servers

try:
    from common import RoundTrips
except ImportError:  # imported as bench.replicas
    from .common import RoundTrips

TIMEOUT = 0.5
"""replica_timeout of the waiting stores (and what a lagging replica costs each call)."""


def measure(store: effectq.RedisStore, calls: int) -> dict[str, float]:
    """Per call: round trips and latency (ms) of first-time effects, then of replays.

    Each call is a run of its own (a task with one effect); the replays bind the
    same run ids again, as a redelivery in another process would.
    """

    @effectq.effect(name="bench.replicas")
    def act(n: int) -> int:
        return n

    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    with effectq.run(f"{prefix}-warm", store=store):
        act(-1)  # connections made, scripts loaded
    out: dict[str, float] = {}
    for phase in ("first", "replay"):
        times: list[float] = []
        with RoundTrips() as sent:
            for n in range(calls):
                started = time.perf_counter()
                with effectq.run(f"{prefix}-{n}", store=store):
                    act(n)
                times.append((time.perf_counter() - started) * 1000)
        out[f"{phase}_rt"] = sent.count / calls
        out[f"{phase}_p50"] = statistics.median(times)
        out[f"{phase}_p95"] = statistics.quantiles(times, n=20)[18]
    return out


def lagging(pair: servers.Pair, calls: int) -> dict[str, float]:
    """The replica's link held: what a claim that must run, and a replay, cost."""
    store = effectq.RedisStore(
        pair.primary.client(), namespace="lag", wait_replicas=1, replica_timeout=TIMEOUT
    )

    @effectq.effect(name="bench.lag")
    def act(n: int) -> int:
        return n

    def call(n: int) -> float:
        started = time.perf_counter()
        with effectq.run(f"lag-{n}", store=store):
            act(n)
        return (time.perf_counter() - started) * 1000

    calls = max(3, calls // 200)
    for n in range(calls):
        call(n)
    pair.hold()
    refused, replays = [], []
    for n in range(calls):
        started = time.perf_counter()
        try:
            call(calls + n)
        except effectq.ClaimNotReplicatedError:
            refused.append((time.perf_counter() - started) * 1000)
        replays.append(call(n))
    return {"refused_p50": statistics.median(refused), "replay_p50": statistics.median(replays)}


Cases = list[tuple[str, Callable[[], effectq.RedisStore]]]


@contextmanager
def deployments() -> Iterator[tuple[Cases, servers.Pair]]:
    with ExitStack() as stack:
        pair = stack.enter_context(servers.primary_with_replica(relay=False))
        relayed = stack.enter_context(servers.primary_with_replica())
        cluster = stack.enter_context(servers.cluster())

        def on(client: Any, replicas: int = 0) -> Callable[[], effectq.RedisStore]:
            namespace = f"b{uuid.uuid4().hex[:8]}"
            return lambda: effectq.RedisStore(
                client, namespace=namespace, wait_replicas=replicas, replica_timeout=TIMEOUT
            )

        cases = [
            ("one Redis with a replica, no wait", on(pair.primary.client())),
            ("one Redis with a replica, wait_replicas=1", on(pair.primary.client(), 1)),
            ("Cluster 3+3, no wait", on(cluster.client())),
            ("Cluster 3+3, wait_replicas=1", on(cluster.client(), 1)),
        ]
        yield cases, relayed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per phase and deployment")
    args = parser.parse_args()
    print(f"{args.calls} calls per phase; latency in ms (p50 / p95); round trips per call\n")
    print("| deployment | first-time: round trips | p50 | p95 | replay: round trips | p50 | p95 |")
    print("|---|---|---|---|---|---|---|")
    with deployments() as (cases, pair):
        for name, make in cases:
            store = make()
            m = measure(store, args.calls)
            store.close()
            print(
                f"| {name} | {m['first_rt']:.0f} | {m['first_p50']:.2f} | {m['first_p95']:.2f} "
                f"| {m['replay_rt']:.0f} | {m['replay_p50']:.2f} | {m['replay_p95']:.2f} |"
            )
        lag = lagging(pair, args.calls)
    print(
        f"\nreplica link held, replica_timeout={TIMEOUT}s: a claim that must run is refused after "
        f"{lag['refused_p50']:.0f} ms (p50); a replay takes {lag['replay_p50']:.0f} ms (p50)"
    )


if __name__ == "__main__":
    main()
