"""What every benchmark shares: a Redis of its own, percentiles, tables, the machine.

Each benchmark measures its systems side by side in one run, interleaved in
rounds (A, B, C, A, B, C, ...), against the same Redis, so a noisy neighbour
slows every system alike and the ratios stay meaningful. Figures are medians
and percentiles of many single calls, in microseconds.
"""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.connection

try:
    from effectq.store.redis.wire.sync import Lane
except ImportError:  # a revision before the wire's own package (bench/versus.py measures those too)
    from effectq.store.lane import Lane  # type: ignore[no-redef]

RESULTS = Path(__file__).resolve().parent / "results"


@contextlib.contextmanager
def redis_server(url: str | None = None) -> Iterator[str]:
    """A Redis to measure against: ``url`` if given, else a redis-server of our own on a free port.

    A server of our own sees no other client's traffic and keeps nothing on disk. With two CPUs
    or more it runs on the last one, and the latency benchmarks (see :func:`pinned`) on the
    others, as a Redis on its own core or machine does in production.
    """
    global _server_cpu
    if url:
        yield url
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cpus = pinning()
    with tempfile.TemporaryDirectory() as scratch:
        proc = subprocess.Popen(
            (["taskset", "-c", str(cpus[1])] if cpus else []) + server_command(port, scratch),
            stdout=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(port=port)
            for _ in range(200):
                with contextlib.suppress(redis.ConnectionError):
                    client.ping()
                    break
                time.sleep(0.025)
            client.close()
            _server_cpu = cpus[1] if cpus else None
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            _server_cpu = None
            proc.terminate()
            proc.wait(10)


_server_cpu: int | None = None
"""The CPU our own redis-server runs on, while it runs."""


def server_command(port: int, scratch: str) -> list[str]:
    """A redis-server of the benchmarks' own: loopback only, nothing kept on disk."""
    loopback = ["--port", str(port), "--bind", "127.0.0.1"]
    return ["redis-server", *loopback, "--save", "", "--appendonly", "no", "--dir", scratch]


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """Run this process on the CPUs our own redis-server does not use (when it was pinned).

    For the single-process latency figures: left to the scheduler, the client and the server
    share a core in some runs and not in others, and the same code measured 1.05x and 1.33x
    the floor from one run to the next. The benchmarks of many processes (contention, end to
    end) stay unpinned, as several workers on one core would measure the scheduler.
    """
    if _server_cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, before - {_server_cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def pinning() -> tuple[set[int], int] | None:
    """(the CPUs for the benchmark, the CPU for its redis-server), or None: no pinning here."""
    if not hasattr(os, "sched_getaffinity") or shutil.which("taskset") is None:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return set(cpus[:-1]), cpus[-1]


def percentile(samples: Sequence[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Series:
    """Latencies of one system, in seconds."""

    name: str
    samples: list[float] = field(default_factory=list)

    def us(self, p: float) -> float:
        return percentile(self.samples, p) * 1e6


def interleave(
    systems: dict[str, Callable[[int], None]],
    n: int,
    rounds: int = 10,
    around: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] | None = None,
) -> dict[str, Series]:
    """Time ``n`` single calls of each system, in ``rounds`` interleaved batches.

    Each system gets the indexes 0..n-1 once, so a call never repeats another's
    work by accident (first-time calls stay first-time). ``around[name]()`` is
    entered for each of that system's batches (a setting only it runs under).
    """
    series = {name: Series(name) for name in systems}
    per_round = max(1, n // rounds)
    around = around or {}
    for start in range(0, n, per_round):
        stop = min(n, start + per_round)
        for name, call in systems.items():
            samples = series[name].samples
            clock = time.perf_counter
            with around.get(name, contextlib.nullcontext)():
                for i in range(start, stop):
                    began = clock()
                    call(i)
                    samples.append(clock() - began)
    return series


def paths_table(first: dict[str, Series], replay: dict[str, Series]) -> str:
    """First-time and replay series as one table, each against its floor (the series named so)."""
    rows = []
    for label, series, floor in (
        ("first-time", first, first["floor (SET NX + SET)"]),
        ("replay", replay, replay["floor (GET)"]),
    ):
        for name, s in series.items():
            rows.append(
                (label, name, s.us(50), s.us(95), s.us(99), s.us(50) / floor.us(50), s.us(95) / floor.us(95))
            )
    return table(["path", "system", "p50", "p95", "p99", "p50 / floor", "p95 / floor"], rows)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table."""
    text = [list(map(str, headers))] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in text) for i in range(len(headers))]
    lines = ["| " + " | ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) + " |" for row in text]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:,.0f}"
    return str(value)


def machine(url: str) -> str:
    """One line naming where the figures came from."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = redis.Redis.from_url(url).info("server")
    where = ""
    if _server_cpu is not None:
        where = f", pinned to CPU {_server_cpu} (the latency benchmarks to the others)"
    return (
        f"{cpu}, {os.cpu_count()} cores; Python {platform.python_version()} ({sys.implementation.name}); "
        f"redis-py {redis.__version__}; Redis {info.get('redis_version')} on loopback{where}; "
        f"{platform.system()} {platform.release()}"
    )


def main_sized(
    doc: str | None, measure: Callable[[str, int], Any], report: Callable[[Any], str], default_n: int
) -> None:
    """The command line of a benchmark measured at one size: ``[-n N] [--redis-url URL]``."""
    import argparse

    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=default_n)
    parser.add_argument("--redis-url")
    args = parser.parse_args()
    with redis_server(args.redis_url) as url, pinned():
        print(report(measure(url, args.n)))


def flusher(store: Any) -> Callable[[], None]:
    """What reads the replies this thread's pipelined completions still have pending: the
    store's ``flush_pending``, or the lane's function of revisions before it (bench/versus.py
    measures those too)."""
    flush = getattr(store, "flush_pending", None)
    if flush is not None:
        return flush  # type: ignore[no-any-return]
    from effectq.store.lane import settle_owed_replies  # type: ignore[import-not-found]

    return settle_owed_replies  # type: ignore[no-any-return]


def cleanup(url: str, *patterns: str) -> None:
    client = redis.Redis.from_url(url)
    for pattern in patterns:
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    client.close()


class RoundTrips:
    """Counts requests sent (a round trip each; a pipeline counts once), while entered.

    Two paths write requests: redis-py's connections (``send_packed_command``) and
    effectq's lane, which writes its scripts on those connections itself. The
    server's own counters would not do: they count the commands a script runs too.
    """

    def __init__(self) -> None:
        self.count = 0
        self._redis_send = redis.connection.AbstractConnection.send_packed_command
        self._lane_write = Lane._write

    def __enter__(self) -> RoundTrips:
        redis_send, lane_write, counter = self._redis_send, self._lane_write, self

        in_lane: list[bool] = []

        def redis_counted(conn: Any, command: Any, check_health: bool = True) -> None:
            if not in_lane:  # the lane writes through send_packed_command: counted there
                counter.count += 1
            redis_send(conn, command, check_health)

        def lane_counted(lane: Lane, conn: Any, frame: bytes) -> None:
            counter.count += 1
            in_lane.append(True)
            try:
                lane_write(lane, conn, frame)
            finally:
                in_lane.pop()

        redis.connection.AbstractConnection.send_packed_command = redis_counted  # type: ignore[method-assign]
        Lane._write = lane_counted  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        redis.connection.AbstractConnection.send_packed_command = self._redis_send  # type: ignore[method-assign]
        Lane._write = self._lane_write  # type: ignore[method-assign]
