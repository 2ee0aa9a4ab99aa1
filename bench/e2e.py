"""End to end: a Celery task with three effects through a real worker and the Redis broker.

The same task runs with effectq installed and without it, in alternating
batches on two real workers (solo pool: one task at a time), and the
throughput of each is compared, with what effectq adds to each task in µs.
Effects that do nothing also run on a prefork pool of two processes (Celery's
default of one per core), where the machine's cores, not the round trips, set
the pace. With effects that do
nothing, so the figure is effectq's whole cost per task (three first-time
effects: three claims waited for, three completions written, the last one's
reply read as the task ends; the worst case), and with effects whose side
effect takes 2 ms and 10 ms each (a fast internal API; real ones often take
tens of milliseconds). Beside it, what one round trip costs back to back and
right after the client slept as long: the claim after an effect is such a
round trip. Then the common task, one effect that does nothing, under each layer: effectq, the
floor's two SETs, and no layer.

    python bench/e2e.py [--tasks 600] [--redis-url URL]
    python bench/e2e.py --one-effect        # only the one-effect task's rows
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

try:
    from common import redis_server, table
except ImportError:  # imported as bench.e2e
    from .common import redis_server, table

HERE = Path(__file__).resolve().parent


LABELS = {
    "none": "no layer",
    "effectq": "effectq",
    "effectq-polling": "effectq, polling for its replies (poll_replies=200 µs)",
    "floor": "floor: SET NX + SET (redis-py)",
    "powertools": "Powertools idempotent_function",
}

SOLO = ("--pool", "solo")
PREFORK = ("--pool", "prefork", "--concurrency", "2")


def _worker(
    url: str, queue: str, layer: str, work_ms: float, pool: tuple[str, ...], effects: int
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "EFFECTQ_BENCH_EFFECTS": str(effects),
        "EFFECTQ_BENCH_WORK_MS": str(work_ms),
        "EFFECTQ_BENCH_URL": url,
        "EFFECTQ_BENCH_LAYER": layer,
        "EFFECTQ_BENCH_QUEUE": queue,
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "e2e_app",
            "worker",
            *pool,
            "-Q",
            queue,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel",
            "WARNING",
        ],
        env=env,
        cwd=HERE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _batch(url: str, queue: str, tasks: int) -> float:
    """Enqueue ``tasks`` tasks and wait for the worker to finish them; returns tasks/s.

    The task that finishes the batch pushes to a list the sender waits on (BLPOP), so the
    clock stops when the last task ends, not at the next poll.
    """
    from celery import Celery

    client = redis.Redis.from_url(url)
    client.delete(f"{queue}:done", f"{queue}:finished")
    sender = Celery("sender", broker=url.rsplit("/", 1)[0] + "/1")
    began = time.perf_counter()
    for order in range(tasks):
        sender.send_task("bench.fulfil", args=[order, tasks], queue=queue)
    deadline = time.monotonic() + 600
    while client.blpop([f"{queue}:finished"], timeout=1) is None:  # under any client socket timeout
        if time.monotonic() > deadline:
            raise TimeoutError(f"{queue}: only {client.get(f'{queue}:done')} of {tasks} tasks finished")
    rate = tasks / (time.perf_counter() - began)
    client.close()
    return rate


def _has_powertools() -> bool:
    try:
        import aws_lambda_powertools.utilities.idempotency  # noqa: F401
    except ImportError:
        return False
    return True


def measure(url: str, tasks: int, rounds: int = 3) -> dict[str, Any]:
    try:
        import celery  # noqa: F401

        import effectq.celery  # noqa: F401
    except ImportError as exc:
        return {"skipped": str(exc)}
    every = ("none", "effectq", "floor") + (("powertools",) if _has_powertools() else ())
    return {
        "tasks": tasks,
        "work": {
            ms: _measure(url, tasks, rounds, ms, SOLO, every if not ms else ("none", "effectq"))
            for ms in (0.0, 2.0, 10.0)
        },
        "prefork": _measure(url, tasks, rounds, 0.0, PREFORK, every),
        "one effect": one_effect(url, tasks),
        "wake": _wake_up(url),
    }


def one_effect(url: str, tasks: int) -> dict[str, dict[str, Any]]:
    """The one-effect rows alone (``--one-effect``): each pool, each layer."""
    layers = ("none", "effectq", "effectq-polling", "floor")
    return {
        pool: _paired(url, tasks, flags, layers) for pool, flags in (("solo", SOLO), ("prefork, 2", PREFORK))
    }


def _wake_up(url: str, samples: int = 200) -> dict[float, float]:
    """p50 µs of one GET, back to back and after the client slept (as it does in an effect).

    A completion is the round trip that follows the side effect. On a machine whose idle cores
    are slow to wake (a VM, say), the one after a wait costs far more than one back to back.
    """
    client = redis.Redis.from_url(url)
    client.set("e2e:wake", b"1")
    out: dict[float, float] = {}
    for gap_ms in (0.0, 2.0, 10.0):
        times = []
        for _ in range(samples):
            if gap_ms:
                time.sleep(gap_ms / 1000)
            began = time.perf_counter()
            client.get("e2e:wake")
            times.append(time.perf_counter() - began)
        out[gap_ms] = sorted(times)[len(times) // 2] * 1e6
    client.delete("e2e:wake")
    client.close()
    return out


def _measure(
    url: str,
    tasks: int,
    rounds: int,
    work_ms: float,
    pool: tuple[str, ...],
    layers: tuple[str, ...],
    effects: int = 3,
) -> dict[str, float]:
    """tasks/s of each layer (see e2e_app), each on its own worker, batches interleaved."""
    tag = uuid.uuid4().hex[:6]
    queues = {layer: f"{layer}-{tag}" for layer in layers}
    workers = {layer: _worker(url, queue, layer, work_ms, pool, effects) for layer, queue in queues.items()}
    rates: dict[str, list[float]] = {layer: [] for layer in layers}
    try:
        for layer in layers:  # warm up: imports, connections, scripts
            _batch(url, queues[layer], 10)
        per_round = max(1, tasks // rounds)
        for _ in range(rounds):
            for layer in layers:
                rates[layer].append(_batch(url, queues[layer], per_round))
    finally:
        for proc in workers.values():
            proc.terminate()
            proc.wait(30)
    client = redis.Redis.from_url(url)
    for pattern in (f"effectq:{{bench-effectq-{tag}*", f"*-{tag}*", "test-func.*keyed#*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
    client.close()
    return {layer: sorted(found)[len(found) // 2] for layer, found in rates.items()}


def _paired(
    url: str, tasks: int, pool: tuple[str, ...], layers: tuple[str, ...], rounds: int = 8
) -> dict[str, Any]:
    """The one-effect task under each layer: short batches, ratios paired by round, CPU per task.

    A ratio of two medians taken minutes apart swings with the machine. Here each round runs every
    layer's batch back to back (the order reversed every other round, so neither side always goes
    first), each round gives its own effectq / layer ratio, and the figure is the median of those,
    with their range. Beside it, the CPU each task costs, which noise on a shared machine moves far
    less than throughput: in the worker (its processes' threads, from /proc) and in Redis (INFO
    cpu; with ``--redis-url`` another client's work counts too).
    """
    tag = uuid.uuid4().hex[:6]
    queues = {layer: f"{layer}-{tag}" for layer in layers}
    workers = {layer: _worker(url, queue, layer, 0.0, pool, 1) for layer, queue in queues.items()}
    rates: dict[str, list[float]] = {layer: [] for layer in layers}
    cpu = {layer: [0.0, 0.0] for layer in layers}  # seconds: the worker's, Redis'
    stolen = {layer: [0, 0] for layer in layers}  # the host's steal, all of the CPUs' time (ticks)
    client = redis.Redis.from_url(url)
    per_round = max(1, tasks // rounds)
    try:
        for layer in layers:  # warm up: imports, connections, scripts
            _batch(url, queues[layer], 10)
        for n in range(rounds):
            for layer in layers if n % 2 == 0 else layers[::-1]:
                worker, server, host = _cpu_seconds(workers[layer].pid), _redis_cpu(client), _steal()
                rates[layer].append(_batch(url, queues[layer], per_round))
                cpu[layer][0] += _cpu_seconds(workers[layer].pid) - worker
                cpu[layer][1] += _redis_cpu(client) - server
                after = _steal()
                stolen[layer][0] += after[0] - host[0]
                stolen[layer][1] += after[1] - host[1]
    finally:
        for proc in workers.values():
            proc.terminate()
            proc.wait(30)
    for pattern in (f"effectq:{{bench-effectq-{tag}*", f"*-{tag}*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
    client.close()
    done = per_round * rounds
    return {
        layer: {
            "rate": statistics.median(rates[layer]),
            "ratios": sorted(
                mine / theirs for mine, theirs in zip(rates["effectq"], rates[layer], strict=True)
            ),
            "worker_us": cpu[layer][0] / done * 1e6,
            "redis_us": cpu[layer][1] / done * 1e6,
            "stolen": stolen[layer][0] / stolen[layer][1] if stolen[layer][1] else 0.0,
        }
        for layer in layers
    }


def _cpu_seconds(pid: int) -> float:
    """CPU time of a worker and its pool's processes, every thread, from /proc (Linux)."""
    total = 0
    for process in [pid, *_children(pid)]:
        for path in Path(f"/proc/{process}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(path.read_text().split()[0])  # ns on the CPU
    return total / 1e9


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _steal() -> tuple[int, int]:
    """(steal, all) ticks of every CPU so far, from /proc/stat: what a virtual machine's host took."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(n) for n in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks[:8])


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def report(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"### End to end (Celery)\n\nskipped: {r['skipped']}"
    if "work" not in r:
        return _one_effect_report(r)
    rows: list[tuple[object, ...]] = []
    for ms, rates in r["work"].items():
        what = "effects that do nothing" if not ms else f"effects taking {ms:g} ms each"
        task_us = 1e6 / rates["none"]
        cost = 1e6 / rates["effectq"] - task_us
        bound = task_us / (task_us + 3 * r["wake"][ms])  # one GET per effect, after as long a wait
        ratio = rates["effectq"] / rates["none"]
        rows.append(("solo", what, rates["none"], rates["effectq"], ratio, cost, bound))
    if "prefork" in r:
        rates = r["prefork"]
        cost = 1e6 / rates["effectq"] - 1e6 / rates["none"]
        ratio = rates["effectq"] / rates["none"]
        task = "effects that do nothing"
        rows.append(("prefork, 2", task, rates["none"], rates["effectq"], ratio, cost, "—"))
    layers = _layers(("solo", r["work"][0.0]), ("prefork, 2", r.get("prefork")))
    out = [
        f"### End to end: a Celery task with three effects, Redis broker, one worker "
        f"({r['tasks']} tasks per figure, median of rounds)",
        "",
        table(
            [
                "pool",
                "task",
                "without effectq, tasks/s",
                "with effectq, tasks/s",
                "ratio",
                "effectq µs/task",
                "ratio at best, one round trip per effect",
            ],
            rows,
        ),
        "",
        "One redis-py GET (p50 µs): "
        + ", ".join(
            f"{us:.0f} {'back to back' if not gap else f'after {gap:g} ms asleep'}"
            for gap, us in r["wake"].items()
        )
        + ". Each effect waits for one round trip, its claim, before it runs; its completion is"
        " written as it returns and answered with the next claim, and the last one when the task"
        ' ends. "At best" is the ratio a layer would reach that added to the task only one such'
        " GET per effect, after as long a wait, and nothing else: what any layer that makes sure"
        " of its claim before the side effect cannot beat. A prefork pool of two processes"
        " keeps both cores busy: there what counts is the CPU each task costs, in the worker"
        " and in Redis, and effectq's µs/task is wall time per task at that pace.",
        "",
        "The same task with effects that do nothing, each layer on its own worker, in the same"
        " rounds: a layer that records its claim and its result, and no more, and what users"
        " pick today.",
        "",
        table(["pool", "layer", "tasks/s", "ratio to no layer", "effectq / layer"], layers),
        "",
        'The floor layer is the issue\'s "floor" per effect in the task: `SET key NX` before the'
        " function, `SET key result` after it, two redis-py round trips, with nothing of what"
        " makes effectq safe (no fencing token, no lease renewal, no unknown after a crash)."
        " Powertools' first-time path is as many round trips, with more Python.",
    ]
    return "\n".join([*out, "", _one_effect_report(r)])


def _one_effect_report(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"### End to end: a Celery task with one effect that does nothing ({r['tasks']} tasks per"
            " figure, median of rounds)",
            "",
            table(
                [
                    "pool",
                    "layer",
                    "tasks/s",
                    "effectq / layer, median of rounds",
                    "range",
                    "worker CPU µs/task",
                    "Redis CPU µs/task",
                    "host steal",
                ],
                _paired_rows(r["one effect"]),
            ),
            "",
            "The task most Celery tasks are: one side effect. effectq waits for its claim, writes its"
            " completion as the effect returns and reads that reply as the task ends, before the"
            " task is acknowledged; the floor layer waits for its two SETs. Each round runs every"
            " layer's batch back to back, the order reversed every other round; the ratio is the"
            " median of the rounds' own ratios, the range their lowest and highest. CPU per task is"
            " the worker's processes' (every thread) and Redis', summed over the rounds: on a shared"
            " machine it moves far less than throughput, and on a busy pool it is what sets the pace."
            " Host steal is the share of the CPUs' time a virtual machine's host took during that"
            " layer's batches (/proc/stat): where it is high or uneven, no figure of the row is sound.",
        ]
    )


def _layers(*pools: tuple[str, dict[str, float] | None]) -> list[tuple[object, ...]]:
    """Rows of (pool, layer, tasks/s, ratio to no layer, effectq / layer)."""
    rows: list[tuple[object, ...]] = []
    for pool, rates in pools:
        for layer, rate in (rates or {}).items():
            assert rates is not None
            mine = "—" if layer == "none" else rates["effectq"] / rate
            rows.append((pool, LABELS[layer], rate, rate / rates["none"], mine))
    return rows


def _paired_rows(pools: dict[str, dict[str, Any]]) -> list[tuple[object, ...]]:
    rows: list[tuple[object, ...]] = []
    for pool, layers in pools.items():
        for layer, got in layers.items():
            ratios = got["ratios"]
            mine = "—" if layer == "effectq" else statistics.median(ratios)
            spread = "—" if layer == "effectq" else f"{ratios[0]:.2f}–{ratios[-1]:.2f}"
            steal = f"{got['stolen']:.0%}"
            rows.append(
                (pool, LABELS[layer], got["rate"], mine, spread, got["worker_us"], got["redis_us"], steal)
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=600)
    parser.add_argument("--redis-url")
    parser.add_argument("--one-effect", action="store_true", help="only the one-effect task's rows")
    args = parser.parse_args()
    with redis_server(args.redis_url) as url:
        if args.one_effect:
            print(report({"tasks": args.tasks, "one effect": one_effect(url, args.tasks)}))
        else:
            print(report(measure(url, args.tasks)))


if __name__ == "__main__":
    main()
