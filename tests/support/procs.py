"""Child processes for the crash, race and zombie tests: ``python -m tests.support.procs SCENARIO ...``.

The remote system is played by Redis keys outside the effectq namespace:
``<ledger>:log`` (a list: one entry per application) and ``<ledger>:by-key`` (a
hash: idempotency key -> first application), so a test can count applications
and a reconcile hook can look one up, across processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import redis

import effectq
from effectq import events


def killed_after_first_line(program: str) -> str:
    """Run the Python ``program`` in a child; SIGKILL it once it printed a line; that line, stripped."""
    proc = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return line


def remote(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


def apply(client: redis.Redis, ledger: str, what: str) -> str:
    """Apply the side effect once per idempotency key, like an API that dedupes."""
    ctx = effectq.current_effect()
    client.rpush(f"{ledger}:log", json.dumps({"what": what, "key": ctx.idempotency_key, "pid": _pid()}))
    client.hsetnx(f"{ledger}:by-key", ctx.idempotency_key, what)
    return what


def lookup(client: redis.Redis, ledger: str) -> Any:
    def find(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> str | None:
        return client.hget(f"{ledger}:by-key", ctx.idempotency_key)  # type: ignore[return-value]

    return find


def _pid() -> int:
    return os.getpid()


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def race(url: str, namespace: str, run_id: str, ledger: str, go_key: str) -> None:
    """Wait for the start signal, then call the effect once; print the result."""
    client = remote(url)
    store = effectq.RedisStore.from_url(url, namespace=namespace)

    @effectq.effect(name="race.apply", wait=60)
    def act() -> str:
        time.sleep(0.05)
        return apply(client, ledger, f"pid-{_pid()}")

    say("ready")
    client.blpop([go_key], timeout=60)
    client.rpush(go_key, "go")  # pass the signal on to the next process
    with effectq.run(run_id, store=store):
        say(json.dumps({"result": act()}))


def crash(url: str, namespace: str, run_id: str, ledger: str, lease: str) -> None:
    """Apply the side effect, then hang before the completion (the test SIGKILLs us)."""
    client = remote(url)
    store = effectq.RedisStore.from_url(url, namespace=namespace)

    @effectq.effect(name="crash.apply", lease=float(lease))
    def act() -> str:
        what = apply(client, ledger, "crashed-attempt")
        say("applied")
        time.sleep(120)
        return what

    with effectq.run(run_id, store=store):
        act()


def crash_async(url: str, namespace: str, run_id: str, ledger: str, lease: str, when: str) -> None:
    """An async effect, its scripts sent from the event loop: apply the side effect, then hang
    before its completion (``when`` = "before") or after the effect returned ("after"); the
    test SIGKILLs us."""
    import asyncio

    client = remote(url)
    store = effectq.RedisStore.from_url(url, namespace=namespace)
    assert store.async_store() is not None  # the path under test

    @effectq.effect(name="crash.async_apply", lease=float(lease))
    async def act() -> str:
        what = apply(client, ledger, "crashed-attempt")
        if when == "before":
            say("applied")
            await asyncio.sleep(120)
        return what

    async def main() -> None:
        with effectq.run(run_id, store=store):
            await act()
            say("returned")
            await asyncio.sleep(120)

    asyncio.run(main())


def zombie(url: str, namespace: str, run_id: str, ledger: str, lease: str) -> None:
    """Claim, announce, block until told to go (the test SIGSTOPs us meanwhile), then apply."""
    client = remote(url)
    store = effectq.RedisStore.from_url(url, namespace=namespace)
    completed: list[events.Event] = []
    events.subscribe(lambda e: completed.append(e) if e.kind == "completed" else None)

    @effectq.effect(name="zombie.apply", lease=float(lease), replay_safe=True)
    def act() -> str:
        say(json.dumps({"token": effectq.current_effect().token}))
        sys.stdin.readline()  # the test SIGSTOPs us here, lets the lease run out, then says go
        time.sleep(float(lease))  # let the resumed heartbeat find out
        lost = effectq.current_effect().lease_lost
        return apply(client, ledger, f"zombie lease_lost={lost}")

    with effectq.run(run_id, store=store):
        result = act()
    say(json.dumps({"result": result, "recorded": bool(completed)}))


def taker(url: str, namespace: str, run_id: str, ledger: str, lease: str) -> None:
    """Call the same replay-safe effect after the zombie's lease ran out: it takes over."""
    client = remote(url)
    store = effectq.RedisStore.from_url(url, namespace=namespace)

    @effectq.effect(name="zombie.apply", lease=float(lease), replay_safe=True)
    def act() -> str:
        return apply(client, ledger, "taker")

    with effectq.run(run_id, store=store):
        say(json.dumps({"result": act(), "token": None}))


def exit_pending(url: str, namespace: str, server_pid: str) -> None:
    """Apply an effect that freezes Redis (SIGSTOP) as it returns, so its completion is written
    but never answered and waits in the heartbeat; then exit normally, the write still pending."""
    import logging
    import os
    import signal

    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")  # stderr
    store = effectq.RedisStore.from_url(
        url, namespace=namespace, socket_timeout=0.5, socket_connect_timeout=0.5
    )
    keys: list[str] = []

    @effectq.effect(name="exit.send")
    def send() -> str:
        keys.append(effectq.current_effect().key)
        os.kill(int(server_pid), signal.SIGSTOP)
        return "sent"

    with effectq.run("exit-run", store=store):
        send()
    say(json.dumps({"key": keys[0]}))


def poison(url: str, namespace: str, run_id: str, lease: str) -> None:
    """Call a replay-safe effect that never returns (the test SIGKILLs us inside it, as an OOM
    killer would); print ``inside <attempt>``, or ``parked <attempts>`` once the key is parked."""
    store = effectq.RedisStore.from_url(url, namespace=namespace)

    @effectq.effect(name="poison.apply", lease=float(lease), wait=30, replay_safe=True)
    def act() -> None:
        say(f"inside {effectq.current_effect().attempt}")
        time.sleep(120)

    with effectq.run(run_id, store=store):
        try:
            act()
        except effectq.AttemptsExhausted as exc:
            say(f"parked {exc.attempts}")


SCENARIOS = {
    "race": race,
    "crash": crash,
    "crash_async": crash_async,
    "zombie": zombie,
    "taker": taker,
    "exit_pending": exit_pending,
    "poison": poison,
}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
