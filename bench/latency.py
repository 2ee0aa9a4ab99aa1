"""Latency of one effect: first time and replay, against the floor and against Powertools.

The floor is what no idempotency layer can beat on the same client: two plain
redis-py round trips (``SET NX``, then ``SET`` of the result) for a first-time
effect, one (``GET``) for a replay. Powertools is AWS Lambda Powertools'
``idempotent_function`` with its Redis persistence layer on the same Redis.
All three run interleaved in one process, the function itself a no-op.

effectq sends its scripts on its own lane (effectq.store.redis.wire), which skips
redis-py's per-command Python; so, for honesty, the same commands written
straight on a pooled connection (read with its parser) are timed beside them:
the bare-socket floor, which no client can beat.

    python bench/latency.py [-n 5000] [--redis-url URL]
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import redis

import effectq
from effectq import events

try:
    from common import Series, flusher, interleave, main_sized, paths_table
except ImportError:  # imported as bench.latency
    from .common import Series, flusher, interleave, main_sized, paths_table


WITH_LISTENER = "effectq, an event listener on"
"""effectq with one event listener subscribed (as metrics or tracing would be): it records each
transition's duration. Plain "effectq" has none, as by default. Like plain "effectq", a first-time
call reads its completion's reply before the clock stops."""


IN_A_RUN = "effectq, the next call reads the reply"
"""effectq as it runs a task's effects one after another: each completion is written before the
effect returns and its reply read by the next effect's claim, so an effect waits for one round
trip. Plain "effectq" reads its own completion's reply before the clock stops: an effect alone in
its run, two round trips waited for, as the floor's."""


IN_A_RUN_LISTENED = "effectq, the next call reads the reply, a listener on"
"""As "effectq, the next call reads the reply", with an event listener subscribed: the completed
event comes when the reply is read."""


VIA_COMMANDS = "effectq, via_execute_command"
"""effectq on a store built with ``via_execute_command=True``: every script through redis-py's
``Redis.execute_command``, which APM's Redis instrumentation sees (no instrumentation installed
here: what redis-py's own command path costs). Its completion's reply is waited for, as plain
"effectq" waits."""


NEW_PROCESS = "effectq, in a process new to the key"
"""A replay where a redelivered task lands: a store that has not yet worked out where the key's
record lives. Plain "effectq" replays in the process that ran the key (an in-process retry)."""


def powertools_effect(client: redis.Redis) -> Any:
    """A Powertools idempotent function on ``client``, or None when Powertools is not installed."""
    try:
        from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig, idempotent_function
        from aws_lambda_powertools.utilities.idempotency.persistence import redis as pt_redis
    except ImportError:
        return None
    layer_class = getattr(pt_redis, "CachePersistenceLayer", None) or pt_redis.RedisCachePersistenceLayer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer = layer_class(client=client)
    config = IdempotencyConfig(expires_after_seconds=7 * 24 * 3600)

    @idempotent_function(data_keyword_argument="payload", persistence_store=layer, config=config)
    def noop(payload: dict[str, int]) -> dict[str, int]:
        return payload

    return noop


class BareSocket:
    """One command written straight on a pooled connection and read with its parser: no client
    machinery at all (what effectq's lane does for its scripts)."""

    def __init__(self, client: redis.Redis) -> None:
        self._pool = client.connection_pool
        self._conn = self._pool.get_connection()

    def __call__(self, *args: str) -> Any:
        conn = self._conn
        conn._sock.sendall(b"".join(conn.pack_command(*args)))
        return conn._parser.read_response()

    def close(self) -> None:
        self._pool.release(self._conn)


def measure(url: str, n: int) -> dict[str, Any]:
    """Run the latency benchmark; returns the series and derived figures."""
    tag = uuid.uuid4().hex[:8]
    client = redis.Redis.from_url(url)
    store = effectq.RedisStore(client, namespace=f"bench-{tag}")

    @effectq.effect(name="bench.noop")
    def noop(i: int) -> int:
        return i

    @effectq.effect(name="bench.noop_in_run")
    def in_run(i: int) -> int:
        return i

    @effectq.effect(name="bench.noop_listened")
    def listened(i: int) -> int:
        return i

    @effectq.effect(name="bench.noop_via_commands")
    def via_commands(i: int) -> int:
        return i

    @effectq.effect(name="bench.noop_listened_in_run")
    def listened_in_run(i: int) -> int:
        return i

    powertools = powertools_effect(client)
    bare = BareSocket(client)
    transitions: dict[str, list[float]] = {"claim": [], "complete": [], "replay": []}
    reply_waits: list[float] = []  # after each completion's write, the wait for its reply

    def listen(event: events.Event) -> None:
        if event.name != "bench.noop_listened":
            return  # another row's events: that listener only costs what a listener costs
        kind = {"claimed": "claim", "completed": "complete", "replayed": "replay"}.get(event.kind)
        if kind:
            transitions[kind].append(event.duration)

    def listened_alone(i: int) -> None:
        listened(i)
        began = time.perf_counter()
        listened_flush()  # the completed event comes with the reply; its duration: the write's
        reply_waits.append(time.perf_counter() - began)

    run_id = f"bench-{tag}"
    listened_store = effectq.RedisStore(client, namespace=f"bench-{tag}")  # a layout memo of its own
    listened_flush, flush = flusher(listened_store), flusher(store)
    try:
        commands_store = effectq.RedisStore(client, namespace=f"bench-{tag}", via_execute_command=True)
    except TypeError:  # a revision without the option (bench/versus.py): the row is left out
        commands_store = None

    @contextlib.contextmanager
    def bound(to: effectq.RedisStore) -> Iterator[None]:
        with effectq.run(run_id, store=to) as run:
            run.prefetch_tried = True  # measure the single-claim replay, not a run's prefetch
            yield

    @contextlib.contextmanager
    def listening() -> Iterator[None]:
        unsubscribe = events.subscribe(listen)
        try:
            with bound(listened_store):
                yield
        finally:
            unsubscribe()

    @contextlib.contextmanager
    def new_process() -> Iterator[None]:
        fresh = effectq.RedisStore(client, namespace=f"bench-{tag}")  # has seen none of the keys
        try:
            with bound(fresh):
                yield
        finally:
            fresh.close()

    threads_before = threading.active_count()
    warnings.simplefilter("ignore")  # Powertools warns on every call outside Lambda
    try:
        if commands_store is not None:
            with bound(commands_store):
                via_commands(-1)  # redis-py's Script: its own sha, loaded
        with bound(store):
            noop(-1)  # load the scripts
            first: dict[str, Any] = {
                "floor (SET NX + SET)": lambda i: (
                    client.set(f"floor:{tag}:{i}", b"1", nx=True),
                    client.set(f"floor:{tag}:{i}", b"result"),
                ),
                "bare socket (SET NX + SET)": lambda i: (
                    bare("SET", f"bare:{tag}:{i}", "1", "NX"),
                    bare("SET", f"bare:{tag}:{i}", "result"),
                ),
                "effectq": lambda i: (noop(i), flush()),
                IN_A_RUN: in_run,
                WITH_LISTENER: listened_alone,
                IN_A_RUN_LISTENED: listened_in_run,
                VIA_COMMANDS: via_commands,
            }
            replay: dict[str, Any] = {
                "floor (GET)": lambda i: client.get(f"floor:{tag}:{i}"),
                "bare socket (GET)": lambda i: bare("GET", f"bare:{tag}:{i}"),
                "effectq": noop,
                NEW_PROCESS: noop,
                WITH_LISTENER: listened,
                VIA_COMMANDS: via_commands,
            }
            if commands_store is None:
                del first[VIA_COMMANDS], replay[VIA_COMMANDS]
            if powertools is not None:
                first["Powertools"] = lambda i: powertools(payload={"n": i})
                replay["Powertools"] = lambda i: powertools(payload={"n": i})
            first_series = interleave(
                first,
                n,
                around={
                    WITH_LISTENER: listening,
                    IN_A_RUN: lambda: bound(store),
                    IN_A_RUN_LISTENED: listening,
                    VIA_COMMANDS: lambda: bound(commands_store),
                },
            )
            replay_series = interleave(
                replay,
                n,
                around={
                    WITH_LISTENER: listening,
                    NEW_PROCESS: new_process,
                    VIA_COMMANDS: lambda: bound(commands_store),
                },
            )
    finally:
        warnings.resetwarnings()
    threads_after = threading.active_count()
    bare.close()
    listened_store.close()
    if commands_store is not None:
        commands_store.close()
    store.close()
    client.close()
    # A completion as a transition: its write, then the wait for its reply (read right after).
    transitions["complete"] = [w + r for w, r in zip(transitions["complete"], reply_waits, strict=True)]
    return {
        "first": first_series,
        "replay": replay_series,
        "transitions": {k: Series(k, v) for k, v in transitions.items()},
        "threads_started": threads_after - threads_before,
        "n": n,
        "cleanup": [f"floor:{tag}:*", f"bare:{tag}:*", f"effectq:{{bench-{tag}*", "*bench_noop*", "*noop#*"],
    }


def report(result: dict[str, Any]) -> str:
    first, replay = result["first"], result["replay"]
    out = [
        f"### Latency of one effect (n = {result['n']} each, interleaved; µs)",
        "",
        paths_table(first, replay),
    ]
    if "Powertools" in first:
        pt_first = first["effectq"].us(50) / first["Powertools"].us(50)
        pt_replay = replay["effectq"].us(50) / replay["Powertools"].us(50)
        out += ["", f"effectq / Powertools at p50: first-time {pt_first:.2f}x, replay {pt_replay:.2f}x."]
    if IN_A_RUN in first:
        out += [
            "",
            f'Effects run one after another in a task ("{IN_A_RUN}"): first-time '
            f"{first[IN_A_RUN].us(50) / first['floor (SET NX + SET)'].us(50):.2f}x the floor at p50. "
            "Each completion is written before its effect returns; the next claim reads its reply.",
        ]
        if IN_A_RUN_LISTENED in first:
            listened = first[IN_A_RUN_LISTENED].us(50) / first["floor (SET NX + SET)"].us(50)
            out[-1] += (
                f" With an event listener on: {listened:.2f}x (the completed event comes with the reply)."
            )
    if VIA_COMMANDS in first:
        out += [
            "",
            f"Scripts through redis-py's execute_command (via_execute_command=True, what APM "
            f"instrumentation sees) against effectq's own wire at p50: first-time "
            f"{first[VIA_COMMANDS].us(50) / first['effectq'].us(50):.2f}x, replay "
            f"{replay[VIA_COMMANDS].us(50) / replay['effectq'].us(50):.2f}x"
            + (
                f"; first-time {first[VIA_COMMANDS].us(50) / first[IN_A_RUN].us(50):.2f}x "
                f'"{IN_A_RUN}" (no completion is pipelined on that path).'
                if IN_A_RUN in first
                else "."
            ),
        ]
    if "bare socket (GET)" in replay:
        bare_first = first["bare socket (SET NX + SET)"].us(50)
        bare_replay = replay["bare socket (GET)"].us(50)
        ours = (first["effectq"].us(50) / bare_first, replay["effectq"].us(50) / bare_replay)
        theirs = (
            first["floor (SET NX + SET)"].us(50) / bare_first,
            replay["floor (GET)"].us(50) / bare_replay,
        )
        out += [
            "",
            f"Against the bare socket at p50: effectq first-time {ours[0]:.2f}x, replay {ours[1]:.2f}x; "
            f"redis-py's own commands {theirs[0]:.2f}x and {theirs[1]:.2f}x.",
        ]
    t = result["transitions"]
    calls = sum(len(s.samples) for f in (first, replay) for k, s in f.items() if k.startswith("effectq"))
    out += [
        "",
        f"Per transition, as the engine saw each store round trip ({WITH_LISTENER}; µs; complete: "
        "the write, then the wait for its reply): "
        + ", ".join(f"{k} p50 {s.us(50):.0f} / p95 {s.us(95):.0f}" for k, s in t.items() if s.samples)
        + ".",
        f"Threads started by {calls} effect calls: {result['threads_started']} "
        "(leases are renewed by one heartbeat thread per process, started once).",
    ]
    return "\n".join(out)


def main() -> None:
    main_sized(__doc__, measure, report, default_n=5000)


if __name__ == "__main__":
    main()
