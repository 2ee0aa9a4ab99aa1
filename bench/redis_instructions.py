"""Redis' own instructions per call, counted by callgrind: effectq's scripts beside SET and GET.

Time on a shared machine swings from run to run; the instructions a redis-server executes
for a command do not. This starts a redis-server of its own under ``valgrind --tool=callgrind``
on a free loopback port, makes ``n`` calls of each kind, and divides the instructions counted
while they ran (reading the request, running the command or script, writing the reply) by
``n``:

* the claim of a free key, the completion, and the claim that finds a completed record (an
  in-process replay), as the store sends them;
* a one-effect task end to end, ``with effectq.run(id): send(x)`` (its claim and its
  completion), and the same task redelivered to a store new to the key (its claim asks for
  the run's index, as a redelivery's first claim does);
* the floor: ``SET NX`` + ``SET``, and ``GET``.

Needs valgrind (``callgrind_control`` beside it). Slow: Redis runs some 50 times slower under
callgrind, so keep ``n`` in the thousands.

    python bench/redis_instructions.py [-n 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

import effectq
from effectq.keys import default_key
from effectq.store.base import ClaimRequest, ResultState

try:
    from common import server_command, table
except ImportError:  # imported as bench.redis_instructions
    from .common import server_command, table


@contextlib.contextmanager
def callgrind_redis(scratch: Path) -> Iterator[tuple[redis.Redis, Callable[[], int]]]:
    """A redis-server under callgrind: (a client, a function returning the instructions since its
    last call)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = scratch / "callgrind.out"
    proc = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            *server_command(port, str(scratch)),
            "--hz",
            "1",  # the server's cron, counted with every figure: as rare as it goes
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        for _ in range(400):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                break
            time.sleep(0.05)
        dumps = [0]

        def since_last() -> int:
            dumps[0] += 1
            subprocess.run(
                ["callgrind_control", f"--dump=part{dumps[0]}", str(proc.pid)],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            return _instructions(scratch, dumps[0])

        since_last()  # start, connection and PING: not counted
        yield client, since_last
    finally:
        client.close()
        proc.terminate()
        proc.wait(60)


def _instructions(scratch: Path, part: int) -> int:
    """The instructions in callgrind's ``part``-th dump (each dump counts from the one before)."""
    for _ in range(100):
        for path in scratch.glob(f"callgrind.out*.{part}"):
            for line in path.read_text().splitlines():
                if line.startswith(("totals:", "summary:")):
                    return int(line.split()[1])
        time.sleep(0.05)
    raise RuntimeError(f"callgrind wrote no dump {part} in {scratch}")


def measure(n: int) -> dict[str, float]:
    """Instructions per call of each kind."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind (with callgrind_control) is needed")
    tag = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory() as scratch, callgrind_redis(Path(scratch)) as (client, since_last):
        store = effectq.RedisStore(client, namespace=f"instr-{tag}")

        @effectq.effect(name="bench.send")
        def send(i: int) -> int:
            return i

        run_id = f"pieces-{tag}"
        keys = [default_key(run_id, "bench.piece", hashlib.sha256(b"%d" % i).hexdigest()) for i in range(n)]
        request = ClaimRequest(lease_ms=60_000, owner=f"instr:{tag}", name="bench.piece", run_id=run_id)
        with effectq.run(f"warm-{tag}", store=store):
            send(-1)  # every script loaded, the connection made
        store.claim(f"warm-{tag}", request)
        since_last()
        out: dict[str, float] = {}

        def counted(label: str, calls: Callable[[], Any]) -> None:
            calls()
            out[label] = since_last() / n

        counted("claim of a free key", lambda: [store.claim(key, request) for key in keys])
        tokens = [store.claim(key, request).token for key in keys]  # a retried claim: its grant back
        since_last()
        counted(
            "completion",
            lambda: [
                store.complete(k, t, result=b"12345", result_state=ResultState.STORED, retention_ms=600_000)
                for k, t in zip(keys, tokens, strict=True)
            ],
        )
        counted("claim of a completed key (replay)", lambda: [store.claim(key, request) for key in keys])

        def first_time() -> None:
            for i in range(n):
                with effectq.run(f"one-{tag}-{i}", store=store):
                    send(i)

        def redelivered() -> None:
            fresh = effectq.RedisStore(client, namespace=f"instr-{tag}")
            for i in range(n):
                with effectq.run(f"one-{tag}-{i}", store=fresh) as again:
                    send(i)
                assert again.stats.replayed == 1
            fresh.close()

        counted("one-effect task, first time (claim + completion)", first_time)
        counted("one-effect task, redelivered (its claim)", redelivered)
        counted(
            "floor: SET NX + SET",
            lambda: [
                (client.set(f"floor:{i}", b"1", nx=True), client.set(f"floor:{i}", b"result"))
                for i in range(n)
            ],
        )
        counted("floor: GET", lambda: [client.get(f"floor:{i}") for i in range(n)])
        store.close()
    return out


def report(result: dict[str, float], n: int) -> str:
    rows = [(label, f"{count:,.0f}") for label, count in result.items()]
    return "\n".join(
        [
            f"### Redis instructions per call (callgrind, {n} calls each)",
            "",
            table(["call", "instructions"], rows),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=1000)
    args = parser.parse_args()
    print(report(measure(args.n), args.n))


if __name__ == "__main__":
    main()
