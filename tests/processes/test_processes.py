"""Crash safety with real processes and a real Redis: races, SIGKILL, SIGSTOP, Redis stopping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import effectq
from effectq._runtime.leases import heartbeat
from tests.support.probes import ROOT, applications, read_line
from tests.support.servers import Server

pytestmark = pytest.mark.slow


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.procs", *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def ledger(redis_client: redis.Redis) -> Iterator[str]:
    name = f"ledger-{uuid.uuid4().hex[:10]}"
    yield name
    redis_client.delete(f"{name}:log", f"{name}:by-key")


def test_processes_racing_one_key_apply_once(
    redis_url: str, redis_client: redis.Redis, namespace: str, ledger: str
) -> None:
    """Eight processes call the same effect at the same moment: exactly one application, one result."""
    run_id, go = f"race-{uuid.uuid4().hex[:8]}", f"{ledger}:go"
    procs = [spawn("race", redis_url, namespace, run_id, ledger, go) for _ in range(8)]
    try:
        for proc in procs:
            assert read_line(proc) == "ready"
        redis_client.rpush(go, "go")
        results = {json.loads(read_line(proc))["result"] for proc in procs}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        redis_client.delete(go)
    assert len(applications(redis_client, ledger)) == 1
    assert len(results) == 1


def killed_after_the_side_effect(redis_url: str, namespace: str, ledger: str) -> str:
    """Run the crash child until it applied its side effect, then SIGKILL it; returns the run id."""
    run_id = f"crash-{uuid.uuid4().hex[:8]}"
    proc = spawn("crash", redis_url, namespace, run_id, ledger, "0.5")
    assert read_line(proc) == "applied"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return run_id


def test_sigkill_after_the_side_effect_is_never_repeated(
    redis_url: str, redis_client: redis.Redis, namespace: str, ledger: str
) -> None:
    """A worker killed between the side effect and the record: the next call gets unknown, not a repeat."""
    run_id = killed_after_the_side_effect(redis_url, namespace, ledger)
    store = effectq.RedisStore(redis_client, namespace=namespace)
    calls: list[int] = []

    @effectq.effect(name="crash.apply", lease=0.5, wait=5)
    def act() -> str:
        calls.append(1)
        return "again"

    with effectq.run(run_id, store=store), pytest.raises(effectq.OutcomeUnknown, match="lease expired"):
        act()
    assert calls == []
    assert len(applications(redis_client, ledger)) == 1


def test_sigkill_after_the_side_effect_is_reconciled(
    redis_url: str, redis_client: redis.Redis, namespace: str, ledger: str
) -> None:
    """With a reconcile hook, the redelivery finds the effect the dead worker applied and records it."""
    from tests.support.procs import lookup

    run_id = killed_after_the_side_effect(redis_url, namespace, ledger)
    store = effectq.RedisStore(redis_client, namespace=namespace)
    remote = redis.Redis.from_url(redis_url, decode_responses=True)

    @effectq.effect(name="crash.apply", lease=0.5, wait=5, reconcile=lookup(remote, ledger))
    def act() -> str:
        raise AssertionError("must not run: the dead worker applied it")

    with effectq.run(run_id, store=store):
        assert act() == "crashed-attempt"
        assert act() == "crashed-attempt"
    assert len(applications(redis_client, ledger)) == 1
    remote.close()


@pytest.mark.parametrize("when", ["before", "after"])
def test_sigkill_around_an_async_effect_is_never_repeated(
    redis_url: str, redis_client: redis.Redis, namespace: str, ledger: str, when: str
) -> None:
    """Async effects send their scripts from the event loop. Killed between the side effect and
    the record, the redelivery gets unknown; killed after the effect returned, it replays."""
    import asyncio

    run_id = f"crash-{uuid.uuid4().hex[:8]}"
    proc = spawn("crash_async", redis_url, namespace, run_id, ledger, "0.5", when)
    assert read_line(proc) == ("applied" if when == "before" else "returned")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = effectq.RedisStore(redis_client, namespace=namespace)
    calls: list[int] = []

    @effectq.effect(name="crash.async_apply", lease=0.5, wait=5)
    async def act() -> str:
        calls.append(1)
        return "again"

    async def redelivered() -> str:
        with effectq.run(run_id, store=store):
            return await act()

    if when == "before":
        with pytest.raises(effectq.OutcomeUnknown, match="lease expired"):
            asyncio.run(redelivered())
    else:
        assert asyncio.run(redelivered()) == "crashed-attempt"
    assert calls == []
    assert len(applications(redis_client, ledger)) == 1
    store.close()


def test_zombie_cannot_complete_over_the_new_owner(
    redis_url: str, redis_client: redis.Redis, namespace: str, ledger: str
) -> None:
    """A holder frozen (SIGSTOP) past its lease is fenced out: the new owner's record stands."""
    run_id, lease = f"zombie-{uuid.uuid4().hex[:8]}", "1.0"
    zombie = spawn("zombie", redis_url, namespace, run_id, ledger, lease)
    try:
        first_token = json.loads(read_line(zombie))["token"]
        os.kill(zombie.pid, signal.SIGSTOP)
        time.sleep(float(lease) * 2)  # its heartbeat is frozen too: the lease runs out
        taker = spawn("taker", redis_url, namespace, run_id, ledger, lease)
        assert json.loads(read_line(taker))["result"] == "taker"
        taker.wait(30)
        os.kill(zombie.pid, signal.SIGCONT)
        assert zombie.stdin is not None
        zombie.stdin.write("go\n")
        zombie.stdin.flush()
        outcome = json.loads(read_line(zombie))
    finally:
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.kill()
        zombie.wait()
    assert outcome["recorded"] is False
    assert "lease_lost=True" in outcome["result"]
    store = effectq.RedisStore(redis_client, namespace=namespace)
    with effectq.run(run_id, store=store):

        @effectq.effect(name="zombie.apply", replay_safe=True)
        def act() -> str:
            raise AssertionError("completed: must replay")

        assert act() == "taker"
        record = store.get(act.key())
    assert record is not None and record.token > first_token
    by_key = redis_client.hgetall(f"{ledger}:by-key")
    assert list(by_key.values()) == [b"taker"]  # the remote deduped the zombie by idempotency key


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, Server]]:
    """A redis-server of this test's own, on a free port; stopped afterwards."""
    server = Server(tmp_path).start()
    yield f"redis://{server.address}/0", server
    server.stop()


def test_redis_stopped_means_nothing_runs(own_redis: tuple[str, Server]) -> None:
    """With Redis down, the call fails with StoreError and the function does not run."""
    url, server = own_redis
    store = effectq.RedisStore.from_url(url, namespace="down", socket_timeout=1, socket_connect_timeout=1)
    calls: list[int] = []

    @effectq.effect
    def act() -> int:
        calls.append(1)
        return 1

    with effectq.run("r1", store=store):
        assert act() == 1
    server.kill()
    with effectq.run("r2", store=store), pytest.raises(effectq.StoreError, match="claim failed"):
        act()
    assert calls == [1]


def test_redis_failing_after_the_side_effect_returns_the_result(
    own_redis: tuple[str, Server], caplog: pytest.LogCaptureFixture
) -> None:
    """The effect applied but Redis died before the record: the caller gets its result, and a loud log."""
    url, server = own_redis
    store = effectq.RedisStore.from_url(url, namespace="late", socket_timeout=1, socket_connect_timeout=1)

    @effectq.effect
    def act() -> str:
        server.kill()
        return "applied"

    with effectq.run("r1", store=store), caplog.at_level("ERROR", logger="effectq.complete"):
        assert act() == "applied"
    assert "recording it failed" in caplog.text


def test_closing_a_store_tries_its_pending_writes_once_more(
    own_redis: tuple[str, Server], caplog: pytest.LogCaptureFixture
) -> None:
    """A completion left to the heartbeat (Redis froze before answering) is tried again when its
    store closes; when it still fails, the log says which key and the command that settles it.
    Another store's pending write stays queued."""
    url, server = own_redis
    assert server.process is not None
    store = effectq.RedisStore.from_url(
        url, namespace="closing", socket_timeout=0.5, socket_connect_timeout=0.5
    )
    keys: list[str] = []

    @effectq.effect(name="closing.send")
    def send() -> str:
        keys.append(effectq.current_effect().key)
        os.kill(server.process.pid, signal.SIGSTOP)  # the completion is written, never answered
        return "sent"

    def other_store_down() -> None:
        raise ConnectionError("another store, still down")

    try:
        with caplog.at_level("INFO", logger="effectq"):
            with effectq.run("r1", store=store):
                assert send() == "sent"
            heartbeat.defer(other_store_down, "complete of another store's key", store=object())
            assert heartbeat.pending()[1] == 2
            store.close()
            assert heartbeat.pending()[1] == 1  # only the other store's write is left
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert "never landed before the store closed" in caplog.text
    assert f"effectq resolve --namespace closing '{keys[0]}' --applied" in caplog.text


def test_a_process_exiting_with_a_write_pending_says_what_to_do(own_redis: tuple[str, Server]) -> None:
    """A worker that exits (a deploy, a warm shutdown) while a completion still waits in the
    heartbeat tries it once more; when it cannot land, the log names the key and the command."""
    url, server = own_redis
    assert server.process is not None
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.procs",
            "exit_pending",
            url,
            "exiting",
            str(server.process.pid),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = child.communicate(timeout=60)
    finally:
        os.kill(server.process.pid, signal.SIGCONT)
    assert child.returncode == 0, err
    key = json.loads(out.splitlines()[-1])["key"]
    assert "recording it failed" in err  # what the call said when it returned
    assert "never landed before the process exited" in err
    assert f"effectq resolve --namespace exiting '{key}' --applied" in err
