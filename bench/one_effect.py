"""A task with one effect, first time and redelivered, against its floor, in a fresh process.

Most tasks do one side effect (send the email, charge the card). bench/latency.py times
effects as a task's effects run one after another; here each call is a whole task of one
effect, in a run of its own:

* first time: ``with effectq.run(id): send(x)``. The run's end reads the completion's
  reply, so both writes are acknowledged, as the floor's two ``SET``\\s (``SET NX``, then
  ``SET`` of the result) are;
* redelivered: the same task again, in a worker whose store has never seen the key (a store
  of its own per batch, the run's prefetch on, as by default), against one ``GET``.

Beside each, the store's own calls for the same path without a run or an effect call around
them (``store.claim`` and ``store.complete`` with requests built beforehand, as
bench/redis_instructions.py sends them): what the round trips cost, Redis' scripts and the
wire included, apart from the Python of the call (its key, its run, its result's decoding).

The systems run interleaved in one Python process started for this benchmark alone (no other
benchmark warmed its caches or its stores' memos). Round trips per call are counted at the
client (bench/common.RoundTrips) on calls of their own, after the timed ones.

    python bench/one_effect.py [-n 3000] [--redis-url URL]
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:
    from common import RoundTrips, Series, interleave, main_sized, table
except ImportError:  # imported as bench.one_effect
    from .common import RoundTrips, Series, interleave, main_sized, table

FIRST_FLOOR = "floor (SET NX + SET)"
FIRST = "effectq, `with effectq.run(id): send(x)`"
REPLAY_FLOOR = "floor (GET)"
REPLAY = "effectq, redelivered to a worker new to the key"
FIRST_POLLED = "effectq, polling for its replies (poll_replies=200 µs)"
REPLAY_POLLED = "effectq, redelivered, polling for its replies (poll_replies=200 µs)"
POLL = 0.0002
"""The ``poll_replies`` of the polling rows, seconds."""
FIRST_STORE = "effectq's store alone: claim, complete (no run, no call)"
REPLAY_STORE = "effectq's store alone: the claim (no run, no call)"
COUNTED = 20
"""Calls per system whose round trips are counted (apart from the timed ones)."""


def measure(url: str, n: int) -> dict[str, Any]:
    """Run the benchmark in a new Python process; returns its series and round trips."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", url, str(n)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    raw = json.loads(out.stdout)
    return {
        "n": n,
        "first": {name: Series(name, s) for name, s in raw["first"].items()},
        "replay": {name: Series(name, s) for name, s in raw["replay"].items()},
        "trips": raw["trips"],
        "cleanup": raw["cleanup"],
    }


def _child(url: str, n: int) -> dict[str, Any]:
    import redis

    import effectq
    from effectq.keys import default_key, sha256
    from effectq.store.base import ClaimRequest, ResultState

    tag = uuid.uuid4().hex[:8]
    namespace = f"bench-one-{tag}"
    client = redis.Redis.from_url(url)
    store = effectq.RedisStore(client, namespace=namespace)

    @effectq.effect(name="bench.send")
    def send(i: int) -> int:
        return i

    def task(on: effectq.RedisStore, runs: str = "one") -> Callable[[int], None]:
        def one(i: int) -> None:
            with effectq.run(f"{runs}-{tag}-{i}", store=on):
                send(i)

        return one

    try:  # a revision before poll_replies has no polling rows
        polled: effectq.RedisStore | None = effectq.RedisStore(client, namespace=namespace, poll_replies=POLL)
    except TypeError:
        polled = None
    fresh: list[effectq.RedisStore] = []

    @contextlib.contextmanager
    def new_worker(**options: Any) -> Iterator[None]:
        """A store that has seen none of the keys, as in a worker the task was redelivered to."""
        fresh.append(effectq.RedisStore(client, namespace=namespace, **options))
        try:
            yield
        finally:
            fresh.pop().close()

    def new_polling_worker() -> contextlib.AbstractContextManager[None]:
        return new_worker(poll_replies=POLL)

    def redelivered(i: int, runs: str = "one") -> None:
        with effectq.run(f"{runs}-{tag}-{i}", store=fresh[-1]) as again:
            send(i)
        assert again.stats.replayed == 1, again.stats

    def redelivered_polling(i: int) -> None:
        redelivered(i, "polled")

    def floor_first(i: int) -> None:
        client.set(f"floor:{tag}:{i}", b"1", nx=True)
        client.set(f"floor:{tag}:{i}", b"result")

    # The store's own calls, on keys of their own (a run each, as the tasks'), with what a call
    # would build made beforehand.
    calls = range(n + COUNTED)
    bare_keys = [default_key(f"bare-{tag}-{i}", "bench.send", sha256(b"%d" % i).hexdigest()) for i in calls]

    def request(i: int, *, prefetch: bool) -> ClaimRequest:
        owner = f"bench:{tag}:{i}:{prefetch}"
        return ClaimRequest(60_000, owner, "bench.send", f"bare-{tag}-{i}", prefetch=prefetch)

    first_requests = [request(i, prefetch=False) for i in calls]
    replay_requests = [request(i, prefetch=True) for i in calls]

    def store_first(i: int) -> None:
        key = bare_keys[i]
        claim = store.claim(key, first_requests[i])
        store.complete(
            key, claim.token, result=b"%d" % i, result_state=ResultState.STORED, retention_ms=600_000
        )

    def store_replay(i: int) -> None:
        fresh[-1].claim(bare_keys[i], replay_requests[i])

    task(store)(-1)  # the scripts loaded, the connection made
    firsts: dict[str, Callable[[int], Any]] = {FIRST_FLOOR: floor_first, FIRST: task(store)}
    replays: dict[str, Callable[[int], Any]] = {
        REPLAY_FLOOR: lambda i: client.get(f"floor:{tag}:{i}"),
        REPLAY: redelivered,
    }
    counting: list[tuple[str, Callable[[int], Any], Callable[[], contextlib.AbstractContextManager[Any]]]] = [
        (FIRST_FLOOR, floor_first, contextlib.nullcontext),
        (FIRST, task(store), contextlib.nullcontext),
        (REPLAY_FLOOR, replays[REPLAY_FLOOR], contextlib.nullcontext),
        (REPLAY, redelivered, new_worker),
    ]
    if polled is not None:
        task(polled, "polled")(-1)
        firsts[FIRST_POLLED] = task(polled, "polled")
        replays[REPLAY_POLLED] = redelivered_polling
        counting += [
            (FIRST_POLLED, firsts[FIRST_POLLED], contextlib.nullcontext),
            (REPLAY_POLLED, redelivered_polling, new_polling_worker),
        ]
    firsts[FIRST_STORE], replays[REPLAY_STORE] = store_first, store_replay
    counting += [(FIRST_STORE, store_first, contextlib.nullcontext), (REPLAY_STORE, store_replay, new_worker)]
    first = interleave(firsts, n)
    replay = interleave(
        replays, n, around={REPLAY: new_worker, REPLAY_POLLED: new_polling_worker, REPLAY_STORE: new_worker}
    )
    trips: dict[str, float] = {}
    counted = range(n, n + COUNTED)
    for name, call, around in counting:
        with around(), RoundTrips() as counter:
            for i in counted:
                call(i)
        trips[name] = counter.count / COUNTED
    store.close()
    if polled is not None:
        polled.close()
    client.close()
    return {
        "first": {name: s.samples for name, s in first.items()},
        "replay": {name: s.samples for name, s in replay.items()},
        "trips": trips,
        "cleanup": [f"floor:{tag}:*", f"effectq:{{{namespace}*"],
    }


def ratios(result: dict[str, Any]) -> tuple[float, float]:
    """(first time, redelivered): effectq's p50 over its floor's."""
    first, replay = result["first"], result["replay"]
    return (
        first[FIRST].us(50) / first[FIRST_FLOOR].us(50),
        replay[REPLAY].us(50) / replay[REPLAY_FLOOR].us(50),
    )


def report(result: dict[str, Any]) -> str:
    rows = []
    for path, series, floor in (
        ("first time, alone in its run", result["first"], FIRST_FLOOR),
        ("redelivered, one call per run", result["replay"], REPLAY_FLOOR),
    ):
        for name, s in series.items():
            rows.append(
                (
                    path,
                    name,
                    s.us(50),
                    s.us(95),
                    s.us(99),
                    s.us(50) / series[floor].us(50),
                    f"{result['trips'][name]:g}",
                )
            )
    first, replay = ratios(result)
    store_first = result["first"][FIRST_STORE].us(50) / result["first"][FIRST_FLOOR].us(50)
    store_replay = result["replay"][REPLAY_STORE].us(50) / result["replay"][REPLAY_FLOOR].us(50)
    return "\n".join(
        [
            f"### A task with one effect, in a process of its own (n = {result['n']} each, interleaved; µs)",
            "",
            table(["path", "system", "p50", "p95", "p99", "p50 / floor", "round trips per call"], rows),
            "",
            f"effectq / its floor at p50: first time {first:.2f}x (both writes acknowledged: the run's "
            f"end reads the completion's reply), redelivered {replay:.2f}x (one round trip: the claim "
            "finds the record completed and replays it; a run of one effect has no other record to "
            "prefetch, and a run of more gets its other records in that same reply). The store's "
            f"calls alone: {store_first:.2f}x and {store_replay:.2f}x; the rest is the Python of the "
            "call and its run.",
        ]
    )


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(_child(sys.argv[2], int(sys.argv[3]))))
        return
    main_sized(__doc__, measure, report, default_n=3000)


if __name__ == "__main__":
    main()
