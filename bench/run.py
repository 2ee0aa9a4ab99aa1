"""Run every benchmark, print one markdown report, write it and its plots to bench/results/.

    python bench/run.py                   # small size: a few minutes
    python bench/run.py --size large      # the documented larger size
    python bench/run.py --redis-url redis://127.0.0.1:6379/0   # a Redis of yours (default: one of our own)

Needs the bench dependency group: pip install -e '.[redis,celery]' --group bench (Powertools,
matplotlib; pip >= 25.1).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parent))

import async_latency
import contention
import e2e
import encoder
import latency
import memory
import one_effect
import pieces
import redelivery
from common import RESULTS, cleanup, machine, pinned, redis_server

SIZES: dict[str, dict[str, Any]] = {
    "smoke": {
        "latency": 200,
        "processes": 2,
        "keys": [8, 50],
        "rounds": 1,
        "sizes": [1, 10],
        "repeat": 2,
        "memory": 20,
        "tasks": 20,
        "encodes": 200,
    },
    "small": {
        "latency": 3000,
        "processes": 4,
        "keys": [8, 1000],
        "rounds": 3,
        "sizes": [1, 10, 100],
        "repeat": 10,
        "memory": 200,
        "tasks": 600,
        "encodes": 5000,
    },
    "large": {
        "latency": 30000,
        "processes": 8,
        "keys": [8, 100, 10000],
        "rounds": 3,
        "sizes": [1, 10, 100, 1000],
        "repeat": 30,
        "memory": 2000,
        "tasks": 2000,
        "encodes": 20000,
    },
}


STEPS = (
    "latency",
    "one effect",
    "pieces",
    "async latency",
    "redelivery",
    "contention",
    "memory",
    "end to end",
    "canonical JSON",
)


class Progress:
    """A line on stderr when each step starts and every ``every`` seconds while it runs.

    A run takes minutes (the large size, much longer): the line says which step is
    running, how far through the steps, and for how long, so a quiet terminal is not
    mistaken for a hung one. stdout keeps only the report.
    """

    def __init__(self, steps: tuple[str, ...] = STEPS, *, every: float = 5.0, out: TextIO = sys.stderr):
        self._steps = steps
        self._every = every
        self._out = out
        self._began = time.monotonic()
        self._step = ""
        self._step_began = self._began
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="bench-progress", daemon=True)

    def _line(self) -> str:
        now = time.monotonic()
        number = self._steps.index(self._step) + 1 if self._step in self._steps else 0
        return (
            f"[bench {now - self._began:5.0f} s] {self._step} ({number}/{len(self._steps)}), "
            f"{now - self._step_began:.0f} s in this step"
        )

    def _say(self) -> None:
        self._out.write(self._line() + "\n")
        self._out.flush()

    def _tick(self) -> None:
        while not self._done.wait(self._every):
            self._say()

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._step, self._step_began = name, time.monotonic()
        self._say()
        if not self._thread.is_alive() and not self._done.is_set():
            self._thread.start()
        yield

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()


def plot(lat: dict[str, Any], red: list[dict[str, Any]], out: Path) -> Path | None:
    """Latency distributions and resume cost against N, as one PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, path in zip(axes[:2], ("first", "replay"), strict=True):
        for name, series in lat[path].items():
            values = sorted(s * 1e6 for s in series.samples)
            cut = values[: max(1, int(len(values) * 0.99))]
            ax.plot(cut, [i / len(values) for i in range(len(cut))], label=name)
        ax.set_title("first-time effect" if path == "first" else "replay of a completed effect")
        ax.set_xlabel("µs (to p99)")
        ax.set_ylabel("fraction of calls")
        ax.grid(alpha=0.3)
        ax.legend()
    ns = [r["n"] for r in red]
    ax = axes[2]
    ax.plot(ns, [r["prefetch"]["ms"] for r in red], marker="o", label="effectq (prefetch)")
    ax.plot(ns, [r["one by one"]["ms"] for r in red], marker="o", label="one claim per effect")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("completed effects N")
    ax.set_ylabel("ms to resume")
    ax.set_title("redelivered task: time to resume")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _update_benchmarks_md(report: str) -> None:
    """Put the report between the markers of BENCHMARKS.md."""
    path = RESULTS.parent.parent / "BENCHMARKS.md"
    text = path.read_text()
    start, end = text.index("<!-- latest -->"), text.index("<!-- /latest -->")
    path.write_text(text[: start + len("<!-- latest -->")] + "\n" + report + "\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--redis-url")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--no-benchmarks-md", action="store_true", help="do not copy the report into BENCHMARKS.md"
    )
    args = parser.parse_args(argv)
    size = SIZES[args.size]
    began = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    progress = Progress()
    with redis_server(args.redis_url) as url, contextlib.closing(progress):
        where = machine(url)
        with pinned():  # one process, timed call by call: kept off Redis' CPU
            with progress.step("latency"):
                lat = latency.measure(url, size["latency"])
                cleanup(url, *lat["cleanup"])
            with progress.step("one effect"):  # in a process of its own, pinned as this one
                one = one_effect.measure(url, size["latency"])
                cleanup(url, *one["cleanup"])
            with progress.step("pieces"):
                parts = pieces.measure(url, size["latency"])
                cleanup(url, *parts["cleanup"])
            with progress.step("async latency"):
                alat = async_latency.measure(url, size["latency"])
                cleanup(url, *alat["cleanup"])
        with progress.step("redelivery"):
            red = redelivery.measure(url, size["sizes"], size["repeat"])
        with progress.step("contention"):
            con = contention.measure(url, size["processes"], size["keys"], size["rounds"])
        with progress.step("memory"):
            mem = memory.measure(url, size["memory"])
        with progress.step("end to end"):
            end = e2e.measure(url, size["tasks"])
        with progress.step("canonical JSON"):
            encodes = encoder.measure(size["encodes"], 5, encoder.OLD_REV)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    sections = [
        f"## effectq benchmarks ({args.size} size, {stamp})",
        "",
        f"Machine: {where}.",
        "",
        latency.report(lat),
        "",
        one_effect.report(one),
        "",
        async_latency.report(alat),
        "",
        pieces.report(parts),
        "",
        redelivery.report(red),
        "",
        contention.report(con, size["processes"]),
        "",
        memory.report(mem),
        "",
        e2e.report(end),
        "",
        encoder.report(*encodes),
        "",
        f"All of the above took {time.perf_counter() - began:.0f} s.",
    ]
    text = "\n".join(sections)
    picture = plot(lat, red, args.out / "latest.png")
    if picture is not None:
        text += "\n\n![latency and resume cost](latest.png)\n"
    (args.out / "latest.md").write_text(text + "\n")
    if args.out == RESULTS and not args.no_benchmarks_md:
        _update_benchmarks_md(text.replace("](latest.png)", "](bench/results/latest.png)"))
    print(text)
    print(f"\nwritten: {args.out / 'latest.md'}" + (f", {picture}" if picture else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
