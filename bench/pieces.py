"""Where the time of one effect goes, piece by piece.

1. Redis CPU per script, from the server's own ``INFO commandstats``: the claim
   of a free key, the completion, the claim that finds a completed record
   (a replay), next to a plain ``SET`` and ``GET``.
2. One round trip three ways, interleaved: redis-py's ``GET``, the same ``GET``
   written on the bare socket, and a trivial script sent on effectq's lane.
3. The Python of one effect call with the store's replies canned (no I/O at
   all): the whole call, and the least any such layer must do (compute the key,
   build the request, read the reply, type the result). Interleaved with real
   round trips the same Python runs slower (cold caches), which the latency
   benchmark shows.

    python bench/pieces.py [-n 3000] [--redis-url URL]
"""

from __future__ import annotations

import hashlib
import itertools
import timeit
import uuid
from typing import Any

import redis
from python_per_call import Canned

import effectq
from effectq.keys import default_key
from effectq.store.base import ClaimRequest, ResultState

try:
    from common import Series, interleave, main_sized, table
    from latency import BareSocket
except ImportError:  # imported as bench.pieces
    from .common import Series, interleave, main_sized, table
    from .latency import BareSocket


def _usec_per_call(client: redis.Redis, command: str) -> float:
    stats = client.info("commandstats").get(f"cmdstat_{command}", {})
    return float(stats.get("usec_per_call", 0.0))


def server_cpu(client: redis.Redis, store: effectq.RedisStore, n: int) -> dict[str, float]:
    """Redis CPU (µs) per script and per plain command."""
    tag = uuid.uuid4().hex[:8]
    run_id = f"pieces-{tag}"
    keys = [default_key(run_id, "bench.piece", hashlib.sha256(b"%d" % i).hexdigest()) for i in range(n)]
    request = ClaimRequest(lease_ms=60_000, owner=f"pieces:{tag}", name="bench.piece", run_id=run_id)
    store.claim(f"warm-{tag}", request)  # the script loaded
    out: dict[str, float] = {}
    client.config_resetstat()
    tokens = [store.claim(key, request).token for key in keys]
    out["claim of a free key"] = _usec_per_call(client, "evalsha")
    client.config_resetstat()
    for key, token in zip(keys, tokens, strict=True):
        store.complete(key, token, result=b"12345", result_state=ResultState.STORED, retention_ms=600_000)
    out["completion"] = _usec_per_call(client, "evalsha")
    client.config_resetstat()
    for key in keys:
        store.claim(key, request)
    out["claim of a completed key (replay)"] = _usec_per_call(client, "evalsha")
    client.config_resetstat()
    for i in range(n):
        client.set(f"pieces:{tag}:{i}", b"12345")
    out["SET"] = _usec_per_call(client, "set")
    client.config_resetstat()
    for i in range(n):
        client.get(f"pieces:{tag}:{i}")
    out["GET"] = _usec_per_call(client, "get")
    return out


def round_trips(client: redis.Redis, store: effectq.RedisStore, n: int) -> dict[str, Series]:
    """One round trip through redis-py, on the bare socket, and on the lane (a trivial script)."""
    lane = store._lane
    bare = BareSocket(client)
    trivial = client.register_script("return 1")
    trivial()
    systems: dict[str, Any] = {
        "redis-py GET": lambda i: client.get("pieces:rt"),
        "bare socket GET": lambda i: bare("GET", "pieces:rt"),
    }
    if lane is not None:
        source = trivial.script
        systems["lane EVALSHA (return 1)"] = lambda i: lane.evalsha(trivial.sha, source, [], [], retry=True)
    try:
        return interleave(systems, n)
    finally:
        bare.close()


def python_only(repeat: int = 7, number: int = 20_000) -> dict[str, float]:
    """µs of Python per call, the store's replies canned (best of ``repeat`` runs of ``number``)."""
    store = effectq.RedisStore.embedded(namespace="pieces")

    @effectq.effect(name="bench.piece")
    def piece(i: int) -> int:
        return i

    packed = b"c1\n1\n1\n\n1\nbench.piece\npieces\n:0123456789abcdef\n\n\n5"
    counter = itertools.count()

    def best(call: Any) -> float:
        return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6

    def least_replay() -> Any:
        call = piece._prepare((next(counter),), {})
        claim = store.claim(call.key, call.request)
        return piece.codec.decode(claim.result)  # type: ignore[arg-type]

    def least_first() -> None:
        call = piece._prepare((next(counter),), {})
        claim = store.claim(call.key, call.request)
        data, state, _ = piece.codec.encode(piece.fn(5), 65536)
        store.complete(call.key, claim.token, result=data, result_state=state, retention_ms=60_000)

    out: dict[str, float] = {}
    with effectq.run("pieces", store=store) as bound:
        bound.prefetch_tried = True  # every replay a claim, as in the latency benchmark
        store._lane = Canned([packed])  # type: ignore[assignment]
        out["replay: the whole call"] = best(lambda: piece(next(counter)))
        out["replay: the least (key, request, reply, typed result)"] = best(least_replay)
        store._lane = Canned([[1, 1, 1, b"d", b""], 1])  # type: ignore[assignment]
        out["first time: the whole call"] = best(lambda: piece(next(counter)))
        out["first time: the least (key, request, replies, encoded result)"] = best(least_first)
    return out


def measure(url: str, n: int) -> dict[str, Any]:
    client = redis.Redis.from_url(url)
    store = effectq.RedisStore(client, namespace=f"bench-p-{uuid.uuid4().hex[:8]}")
    try:
        cpu = server_cpu(client, store, n)
        trips = round_trips(client, store, n)
    finally:
        store.close()
        client.close()
    return {
        "cpu": cpu,
        "trips": trips,
        "python": python_only(number=max(1000, 5 * n)),
        "cleanup": ["pieces:*", "effectq:{bench-p-*"],
    }


def report(result: dict[str, Any]) -> str:
    cpu, trips, python = result["cpu"], result["trips"], result["python"]
    floor = trips["bare socket GET"].us(50)
    return "\n".join(
        [
            "### Where the time goes, piece by piece",
            "",
            table(["Redis CPU per command", "µs"], list(cpu.items())),
            "",
            table(
                ["one round trip (interleaved)", "p50 µs", "p95 µs", "p50 / bare socket"],
                [(name, s.us(50), s.us(95), s.us(50) / floor) for name, s in trips.items()],
            ),
            "",
            table(["Python per call, no I/O (best of 7)", "µs"], list(python.items())),
        ]
    )


def main() -> None:
    main_sized(__doc__, measure, report, default_n=3000)


if __name__ == "__main__":
    main()
