"""An exception raised from a signal handler around effect calls cannot crash the process.

A worker's time limit (Celery's soft time limit, a ``SIGALRM`` handler of one's
own) raises an exception from a signal handler, between any two bytecodes of
whatever runs. Inside C code that calls back into Python without checking for
that exception (hiredis' ``pack_command`` turning an int into text did, for
effectq's frames and for every command redis-py packs, the connection handshake
included), the process dies with SIGSEGV instead of raising. The storm runs in a
child process and asserts the child exits normally.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import redis

import effectq
from effectq.store.redis.wire.frames import SignalSafePacker, _pack_command
from effectq.store.redis.wire.sync import _pool_args

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")

STORM = """
import random, signal, sys, time

import effectq
from effectq.store.base import ClaimRequest, ResultState


class Interrupted(Exception):
    pass


def storm(call, seed, landed_at_least, deadline):
    \"\"\"Call ``call`` over and over while SIGALRM, set to fire every 10-200 us, raises into it;
    until that many exceptions landed (or the deadline passed). Returns (calls, exceptions).\"\"\"
    rng = random.Random(seed)
    armed = [False]

    def interrupt(signum, frame):
        if armed[0]:
            raise Interrupted

    signal.signal(signal.SIGALRM, interrupt)
    calls = landed = 0
    give_up = time.monotonic() + deadline
    while landed < landed_at_least and time.monotonic() < give_up:
        try:
            armed[0] = True
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(10e-6, 200e-6))
            while True:
                call()
                calls += 1
        except Interrupted:
            armed[0] = False  # first: nothing in an except clause checks for signals before it
            landed += 1
    armed[0] = False
    signal.setitimer(signal.ITIMER_REAL, 0)
    return calls, landed


store = effectq.RedisStore.from_url(sys.argv[1], namespace="storm")  # connects to nothing
from effectq.store.redis.wire.frames import frame as frame_script

key = "run-1:storm.charge:" + "ab" * 32
layout, claim_args = store._claim_args(
    key,
    ClaimRequest(lease_ms=60_000, owner="h:1:1", name="storm.charge", run_id="run-1", input_hash="ef" * 32),
)
complete_keys, complete_args = store._complete_args(key, 17, b"charged 250", ResultState.STORED, 604_800_000)
claim_sha, complete_sha = store._scripts["claim"].sha, store._scripts["complete"].sha


def frame():
    frame_script(claim_sha, layout.script_keys, claim_args)
    frame_script(complete_sha, complete_keys, complete_args)


calls, landed = storm(frame, int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
print(calls, landed, flush=True)
"""

LANDED = 3000
"""Exceptions raised into the framing per run: handing hiredis ints, the child died within the first five."""


def _storm(seed: int) -> subprocess.CompletedProcess[str]:
    """The storm in a child process; a child still running after two minutes is killed."""
    program = textwrap.dedent(STORM)
    url = "redis://127.0.0.1:1/0"  # never connected to: only the framing runs
    command = [sys.executable, "-c", program, url, str(seed), str(LANDED), "60"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})


@pytest.mark.slow
@pytest.mark.parametrize("timing", ["fixed", "random"])
def test_exceptions_raised_into_the_framing_of_scripts_never_crash_the_process(timing: str) -> None:
    """Claim and complete frames, built as the store builds them, under a storm of exceptions
    raised from a SIGALRM handler: the child raises and carries on each time, and exits normally.
    The storm's timing comes from a seed: a fixed one, and a random one (said on failure)."""
    seed = 20240522 if timing == "fixed" else random.randrange(2**32)
    done = _storm(seed)
    assert done.returncode == 0, (
        f"the storm (seed {seed}) ended the child with {done.returncode} "
        f"({'signal ' + signal.Signals(-done.returncode).name if done.returncode < 0 else 'an error'}):"
        f"\n{done.stderr[-2000:]}"
    )
    calls, landed = (int(n) for n in done.stdout.split())
    assert landed == LANDED, f"seed {seed}: only {landed} exceptions landed in {calls} calls"


@pytest.mark.skipif(_pack_command is None, reason="hiredis is not installed")
def test_the_framing_hands_hiredis_nothing_it_converts_by_calling_python() -> None:
    """hiredis turns an int or a float into text by calling back into Python, without checking
    the exception a signal handler may raise there; the lane hands it text and bytes alone, and
    the frame is the same bytes as before."""
    seen: list[tuple[object, ...]] = []
    from effectq.store.redis.wire import frames as frames_module

    def spy(command: tuple[object, ...]) -> bytes:
        seen.append(command)
        assert _pack_command is not None
        return _pack_command(command)

    original = frames_module._pack_command
    frames_module._pack_command = spy
    try:
        sha = "a" * 40
        keys = ["k1", "k2"]
        args = [60_000, "owner", b"\x00bytes", 2**70, -1, 1.5, bytearray(b"ba"), memoryview(b"mv")]
        frame = frames_module.frame(sha, keys, args)
    finally:
        frames_module._pack_command = original
    assert frame == frames_module.frame_python(sha, keys, args)
    assert seen and all(type(part) in (str, bytes) for command in seen for part in command)


def test_the_packer_redis_py_is_given_sends_the_bytes_hiredis_would() -> None:
    """The packer effectq gives redis-py's connections writes every command as redis-py's
    hiredis packer does, and refuses what it refuses."""
    hiredis_packer = pytest.importorskip("redis.connection").HiredisRespSerializer
    if _pack_command is None:
        pytest.skip("hiredis is not installed")
    commands: list[tuple[Any, ...]] = [
        ("HELLO", 3, "AUTH", "user", "secret"),
        ("CLIENT SETINFO", "LIB-NAME", "redis-py"),
        (b"SELECT", 15),
        ("SET", "k", 1.5, "PX", 60_000, "NX"),
        (
            "EVALSHA",
            "a" * 40,
            4,
            "k1",
            "k2",
            "k3",
            "k4",
            60000,
            "owner:1",
            "ri",
            "name\nrun\nkey\n",
            604800000,
        ),
        ("MSET", bytearray(b"b"), memoryview(b"m"), "\u00e9t\u00e9", -(2**70), 1e300),
    ]
    for command in commands:
        try:
            expected = hiredis_packer().pack(*command)
        except redis.DataError:  # redis-py 5.0 refuses bytearray and memoryview; the packer takes them
            continue
        assert SignalSafePacker().pack(*command) == expected, command
    for bad in [("SET", "k", True), ("SET", "k", None), ("SET", "k", object())]:
        with pytest.raises(redis.DataError):
            SignalSafePacker().pack(*bad)
        with pytest.raises(redis.DataError):
            hiredis_packer().pack(*bad)


def test_the_clients_a_store_uses_pack_commands_without_hiredis_calling_python(
    redis_url: str, namespace: str
) -> None:
    """A store built from a URL, a store given a client of the user's, the embedded store: the
    connections their pools make from now on, and those idle in them, pack with the signal-safe
    packer."""
    if _pack_command is None or not getattr(redis.connection, "HIREDIS_AVAILABLE", False):
        pytest.skip("redis-py does not pack with hiredis here")
    built = effectq.RedisStore.from_url(redis_url, namespace=namespace)
    given = redis.Redis.from_url(redis_url)
    given.ping()  # a connection made before the store: idle in the pool
    before = given.connection_pool._available_connections[0]
    store = effectq.RedisStore(given, namespace=namespace)
    embedded = effectq.RedisStore.embedded(namespace=namespace)
    try:
        for client in (built.client, given, embedded.client):
            assert isinstance(client.connection_pool.connection_kwargs["command_packer"], SignalSafePacker)
            conn = client.connection_pool.get_connection(*_pool_args(client.connection_pool))
            try:
                assert isinstance(conn._command_packer, SignalSafePacker)
            finally:
                client.connection_pool.release(conn)
        assert isinstance(before._command_packer, SignalSafePacker)
        assert built.client.ping() and given.ping() and embedded.client.ping()
        assert store._async_lane is not None  # asyncio connections pack in Python: the packer stays behind
    finally:
        embedded.close()
        built.close()
        built.client.close()
        store.close()
        given.close()


POOL_STORM = """
import random, signal, sys, time

import redis

import effectq
from effectq.store.base import ClaimRequest, ResultState
from effectq.store.redis.wire.sync import flush_pending
from billiard.exceptions import SoftTimeLimitExceeded as Interrupted  # a worker's time limit
from effectq.errors import StoreError  # looked up here: a limit may land in a lookup


url, namespace, seed, landed_at_least, deadline = sys.argv[1:6]
client = redis.Redis.from_url(url, max_connections=8)
store = effectq.RedisStore(client, namespace=namespace)
rng = random.Random(int(seed))
armed = [False]


def interrupt(signum, frame):
    if armed[0]:
        raise Interrupted


def calls(n):
    key = f"storm-{n % 40}"
    claim = store.claim(key, ClaimRequest(lease_ms=60_000, owner=f"h:1:{n}", name="storm", run_id="r"))
    store.get(key)
    if claim.token:
        store.complete_pipelined(key, claim.token, lambda outcome: None, result=b"x",
                            result_state=ResultState.STORED, retention_ms=60_000)
    flush_pending()


calls(0)  # the lane's connection checked out before the storm (see the docstring)
signal.signal(signal.SIGALRM, interrupt)
n = landed = 0
give_up = time.monotonic() + float(deadline)
while landed < int(landed_at_least) and time.monotonic() < give_up:
    try:
        armed[0] = True
        signal.setitimer(signal.ITIMER_REAL, rng.uniform(10e-6, 400e-6))
        while time.monotonic() < give_up:
            n += 1
            calls(n)
            if not signal.getitimer(signal.ITIMER_REAL)[0]:  # fired, and swallowed by redis-py 8's
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(10e-6, 400e-6))  # metrics hooks
    except Interrupted:
        armed[0] = False
        landed += 1
    except StoreError as exc:
        armed[0] = False
        if not isinstance(exc.__cause__, Interrupted):
            raise  # the pool ran out of connections (MaxConnectionsError): some leaked
        landed += 1
armed[0] = False
signal.setitimer(signal.ITIMER_REAL, 0)
for i in range(20):  # the store still works, on the pool's eight connections at most
    calls(i)
print(n, landed, flush=True)
"""


@pytest.mark.slow
def test_a_storm_of_interrupts_leaks_no_connection(redis_url: str, namespace: str) -> None:
    """Store calls (claims, reads, pipelined completions and their replies) on a client whose pool
    holds eight connections, under a storm of time limits raised from a SIGALRM handler: however
    they land, no connection is lost to the pool: calls never run out of connections. The first
    call checks out the connection the lane keeps: redis-py's own checkout can lose one to an
    exception raised inside it."""
    seed = random.randrange(2**32)
    program = textwrap.dedent(POOL_STORM)
    command = [sys.executable, "-c", program, redis_url, namespace, str(seed), "2000", "60"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 0, f"seed {seed}: {done.stderr[-3000:]}"
    calls, landed = (int(n) for n in done.stdout.split())
    assert landed == 2000, f"seed {seed}: only {landed} exceptions landed in {calls} calls"
