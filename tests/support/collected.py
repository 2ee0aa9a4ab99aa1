"""Whether effectq lets go of a loop or a store, asked in a process of its own.

``python -m tests.support.collected SCENARIO REDIS_URL NAMESPACE`` prints one JSON line. Whether
an object is collected depends on every reference the process holds, and a test suite holds
many that are not effectq's (its captures, the threads and tracebacks of earlier tests): here
only the scenario's own code and effectq hold anything. An object still alive is reported
with the chains of objects that hold it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import time
import types
import uuid
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def verdict(scenario: str, redis_url: str, namespace: str) -> dict[str, Any]:
    """Run ``scenario`` in a child Python; its JSON verdict."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.collected", scenario, redis_url, namespace],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def holders(obj: object, depth: int = 6, width: int = 4) -> list[str]:
    """The chains of referrers that keep ``obj`` alive, innermost first, as text (this
    function's own lists and frames left out)."""
    own = {holders.__code__, _alive.__code__}
    skip: set[int] = set()
    modules = {id(vars(module)): name for name, module in list(sys.modules.items()) if module is not None}
    chains: list[str] = []

    def described(o: object) -> str:
        if isinstance(o, types.FrameType):
            return f"frame {o.f_code.co_name} ({o.f_code.co_filename}:{o.f_lineno})"
        if id(o) in modules:
            return f"module {modules[id(o)]}"
        if isinstance(o, dict):
            return "dict with keys " + ", ".join(map(str, list(o)[:6]))
        if isinstance(o, (list, tuple, set)):
            return f"{type(o).__name__} of {len(o)}"
        return f"{type(o).__module__}.{type(o).__qualname__}"

    def walk(o: object, left: int, path: list[str]) -> None:
        referrers = gc.get_referrers(o)
        skip.add(id(referrers))
        found = [r for r in referrers if id(r) not in skip and not _own_frame(r, own)]
        chosen = found[:width]
        skip.update((id(found), id(chosen)))
        if left == 0 or not chosen:
            chains.append(" <- ".join(path) + ("" if chosen else " <- (a running frame, or C code)"))
            return
        for r in chosen:
            skip.add(id(r))
            if id(r) in modules:  # a module's globals: the chain's root
                chains.append(" <- ".join([*path, described(r)]))
            else:
                walk(r, left - 1, [*path, described(r)])

    own.add(walk.__code__)
    skip.update((id(chains), id(skip), id(modules)))
    walk(obj, depth, [described(obj)])
    return chains


def _own_frame(o: object, own: set[types.CodeType]) -> bool:
    return isinstance(o, types.FrameType) and o.f_code in own


def _alive(refs: list[weakref.ref[Any]]) -> list[list[str]]:
    """For each object of ``refs`` still alive after a collection, what holds it."""
    gc.collect()
    alive = []
    for ref in refs:
        obj = ref()
        if obj is not None:
            alive.append(holders(obj))
        del obj
    return alive


def _effect(calls: list[int]) -> Any:
    import effectq

    @effectq.effect(name=f"collected.send.{uuid.uuid4().hex[:6]}")
    async def send(n: int) -> dict[str, int]:
        calls.append(n)
        return {"sent": n}

    return send


def loops_of_asyncio_run(redis_url: str, namespace: str) -> dict[str, Any]:
    """Three ``asyncio.run`` calls, each running an async effect, as a task queue runs its tasks."""
    import redis

    import effectq

    store = effectq.RedisStore(redis.Redis.from_url(redis_url), namespace=namespace)
    calls: list[int] = []
    send = _effect(calls)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def main() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=store):
            await send(1)

    for _ in range(3):
        asyncio.run(main())
    return {"alive": _alive(loops), "calls": calls}


def loop_closed_without_shutdown(redis_url: str, namespace: str) -> dict[str, Any]:
    """A loop closed without ``shutdown_asyncgens``, as some runners do: collecting it raises
    nothing, even where Python can only print it ("Exception ignored"), and frees it."""
    import redis

    import effectq

    unraisable: list[str] = []
    sys.unraisablehook = lambda u: unraisable.append(f"{u.err_msg}: {u.exc_value!r} ({u.object!r})")
    store = effectq.RedisStore(redis.Redis.from_url(redis_url), namespace=namespace)
    calls: list[int] = []
    send = _effect(calls)

    async def main() -> None:
        with effectq.run(f"lane-{uuid.uuid4().hex[:8]}", store=store):
            await send(1)

    loop = asyncio.new_event_loop()
    loop.run_until_complete(main())
    loop.close()
    ref = weakref.ref(loop)
    del loop
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # its sockets closed by the collector
        alive = _alive([ref])
    return {"alive": alive, "calls": calls, "unraisable": unraisable}


def _named_client(redis_url: str, name: str) -> Any:
    import redis

    return redis.Redis(connection_pool=redis.ConnectionPool.from_url(redis_url, client_name=name))


def _collected(ref: weakref.ref[Any], within: float = 5.0) -> list[list[str]]:
    """Collect garbage until ``ref``'s object is gone, for up to ``within`` seconds: the heartbeat
    thread holds the leases it last looked at (a store's among them) until its next look."""
    deadline = time.monotonic() + within
    gc.collect()
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    return _alive([ref])


def store_dropped_after_a_run(redis_url: str, namespace: str) -> dict[str, Any]:
    """A store dropped without ``close()`` after an effect ran on it: its lane's connection goes
    back to the client's pool, and the client's next command reuses it."""
    import redis

    import effectq

    name = f"dropped-{uuid.uuid4().hex[:8]}"
    client = _named_client(redis_url, name)
    admin = redis.Redis.from_url(redis_url)
    store = effectq.RedisStore(client, namespace=namespace)

    @effectq.effect(name="collected.double")
    def double(n: int) -> dict[str, int]:
        return {"n": n * 2}

    with effectq.run("dropped", store=store):
        result = double(1)
    dropped = weakref.ref(store)
    del store
    alive = _collected(dropped)
    client.ping()
    connections = [c.get("name") for c in admin.client_list()].count(name)
    return {"alive": alive, "result": result, "connections": connections}


def store_dropped_after_its_lease_was_renewed(redis_url: str, namespace: str) -> dict[str, Any]:
    """A store dropped without ``close()`` after an effect ran long enough for the heartbeat to
    renew its lease: the heartbeat, asleep with no lease held, holds nothing of the store."""

    import effectq

    name = f"dropped-renewed-{uuid.uuid4().hex[:8]}"
    client = _named_client(redis_url, name)
    renewals: list[int] = []

    class Counted(effectq.RedisStore):
        def renew(self, key: str, token: int, *, lease_ms: int) -> bool:
            renewals.append(token)
            return super().renew(key, token, lease_ms=lease_ms)

    store = Counted(client, namespace=namespace)

    @effectq.effect(name="collected.slow", lease=0.3)  # renewed every 0.1 s
    def slow(n: int) -> int:
        time.sleep(0.5)
        return n

    with effectq.run("renewed", store=store):
        result = slow(1)
    dropped = weakref.ref(store)
    del store
    return {"alive": _collected(dropped), "result": result, "renewed": len(renewals) > 0}


def store_dropped_while_listening(redis_url: str, namespace: str) -> dict[str, Any]:
    """A store dropped without ``close()`` after a waiter subscribed to its notifications: the
    listener stops and its connection, taken from the client's pool, is closed."""
    import redis

    import effectq

    name = f"dropped-notify-{uuid.uuid4().hex[:8]}"
    client = _named_client(redis_url, name)
    admin = redis.Redis.from_url(redis_url)

    def held() -> int:
        return [c.get("name") for c in admin.client_list()].count(name)

    store = effectq.RedisStore(client, namespace=namespace)
    store.watch("some-key", lambda: None)  # the listener subscribes, on a connection of its own
    listening = held()
    dropped = weakref.ref(store)
    del store
    alive = _collected(dropped)
    deadline = time.monotonic() + 5  # the listener stops within half a second
    while held() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"alive": alive, "listening": listening, "after": held()}


SCENARIOS: dict[str, Callable[[str, str], dict[str, Any]]] = {
    "loops-of-asyncio-run": loops_of_asyncio_run,
    "loop-closed-without-shutdown": loop_closed_without_shutdown,
    "store-dropped-after-a-run": store_dropped_after_a_run,
    "store-dropped-while-listening": store_dropped_while_listening,
    "store-dropped-after-its-lease-was-renewed": store_dropped_after_its_lease_was_renewed,
}


if __name__ == "__main__":
    scenario, url, ns = sys.argv[1:4]
    print(json.dumps(SCENARIOS[scenario](url, ns)), flush=True)
