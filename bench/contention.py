"""Contention: P processes hammering K keys; every key must execute exactly once.

Each process calls the same K effects (one run) in its own shuffled order, R
rounds over them (more rounds for few keys, so the rate is stable), so hot
keys (small K) collide all the time and cold keys (large K) rarely. effectq
must execute each key once in total (counted by an INCR the effect makes);
throughput is compared with raw redis-py doing the naive ``SET NX`` / ``GET``
dance with the same P processes, which has no waiting, no fencing and no
crash safety: it is the floor. The run's prefetch is off here, so every
effectq call is a claim on Redis (with it, a process's later replays would
not reach Redis at all).

    python bench/contention.py [-p 4] [--keys 8 1000] [--rounds 3] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
import uuid
from typing import Any

import redis

try:
    from common import redis_server, table
except ImportError:  # imported as bench.contention
    from .common import redis_server, table


def _effectq_worker(url: str, namespace: str, run_id: str, keys: int, rounds: int, seed: int, go: Any) -> int:
    import effectq

    client = redis.Redis.from_url(url)
    store = effectq.RedisStore(client, namespace=namespace)
    counter = f"{namespace}:executions"

    @effectq.effect(name="bench.hot", wait=60)
    def hit(k: int) -> int:
        client.incr(counter)
        return k

    order = list(range(keys))
    random.Random(seed).shuffle(order)
    go.wait()
    calls = 0
    with effectq.run(run_id, store=store) as bound:
        bound.prefetch_tried = True  # every call goes to Redis: this measures contention on the claim
        for _ in range(rounds):
            for k in order:
                hit(k)
                calls += 1
    return calls


def _raw_worker(url: str, namespace: str, keys: int, rounds: int, seed: int, go: Any) -> int:
    client = redis.Redis.from_url(url)
    counter = f"{namespace}:executions"
    order = list(range(keys))
    random.Random(seed).shuffle(order)
    go.wait()
    calls = 0
    for _ in range(rounds):
        for k in order:
            key = f"{namespace}:raw:{k}"
            if client.set(key, b"claimed", nx=True):
                client.incr(counter)
                client.set(key, str(k))
            else:
                client.get(key)
            calls += 1
    return calls


def _child(target: Any, args: tuple[Any, ...], go: Any, out: Any) -> None:
    out.put(target(*args, go))


def _run(target: Any, args_for: Any, processes: int) -> tuple[int, float]:
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_child, args=(target, args_for(i), go, out)) for i in range(processes)]
    for child in children:
        child.start()
    time.sleep(1.5)  # let every process import and connect
    began = time.perf_counter()
    go.set()
    calls = sum(out.get(timeout=600) for _ in children)
    elapsed = time.perf_counter() - began
    for child in children:
        child.join(30)
    return calls, elapsed


def measure(url: str, processes: int, key_counts: list[int], rounds: int) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(url)
    results = []
    for keys in key_counts:
        spins = max(rounds, 2000 // keys)  # enough calls for a stable rate even with few keys
        tag = uuid.uuid4().hex[:8]
        ns_e, ns_r = f"bench-c-{tag}", f"bench-r-{tag}"
        calls, elapsed = _run(
            _effectq_worker,
            lambda i, ns=ns_e, t=tag, k=keys, r=spins: (url, ns, f"run-{t}", k, r, i),
            processes,
        )
        raw_calls, raw_elapsed = _run(
            _raw_worker, lambda i, ns=ns_r, k=keys, r=spins: (url, ns, k, r, i), processes
        )
        results.append(
            {
                "keys": keys,
                "calls": calls,
                "executions": int(client.get(f"{ns_e}:executions") or 0),
                "effectq_per_s": calls / elapsed,
                "raw_per_s": raw_calls / raw_elapsed,
                "raw_executions": int(client.get(f"{ns_r}:executions") or 0),
            }
        )
        for pattern in (f"effectq:{{{ns_e}*", f"{ns_e}:*", f"{ns_r}:*"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)
    client.close()
    return results


def report(results: list[dict[str, Any]], processes: int) -> str:
    rows = [
        (
            r["keys"],
            r["calls"],
            r["executions"],
            "yes" if r["executions"] == r["keys"] else "NO",
            r["effectq_per_s"],
            r["raw_per_s"],
            r["effectq_per_s"] / r["raw_per_s"],
        )
        for r in results
    ]
    return "\n".join(
        [
            f"### Contention: {processes} processes, the same keys (calls/s)",
            "",
            table(
                ["keys", "calls", "executions", "each once", "effectq /s", "raw redis-py /s", "ratio"], rows
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--processes", type=int, default=4)
    parser.add_argument("--keys", type=int, nargs="+", default=[8, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    with redis_server(args.redis_url) as url:
        print(report(measure(url, args.processes, args.keys, args.rounds), args.processes))


if __name__ == "__main__":
    main()
