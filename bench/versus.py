"""Old against new: bench/run.py's ratios on two revisions, their child processes taking turns.

    python bench/versus.py c7fe8d0                        # c7fe8d0 against this checkout
    python bench/versus.py c7fe8d0 ../other-checkout      # against another revision or checkout
    python bench/versus.py c7fe8d0 --rounds 8 --group latency --group contention

Figures of one process against another's move by which process ran when: a row whose code is
the same in both trees moved 10% from one whole ``bench/run.py`` to the next in one sitting.
So each figure here is effectq's over its baseline measured beside it, interleaved, in the same
child process (the floor's SET NX + SET or GET, raw redis-py, one claim per effect, the floor
layer in a Celery worker), and that ratio is what is compared, old against new: whatever slows
the whole child slows both alike and cancels.

OLD (and NEW, when it is a revision) is checked out in a temporary detached git worktree,
removed after. For each group, children run K rounds taking turns (old, new, then new, old,
...), each importing effectq from its tree (PYTHONPATH, checked in the child) and running
this checkout's bench modules, which tolerate the older API (a row it lacks is shown for one
side only). Redis is a redis-server of its own (or ``--redis-url``). The table gives each
row's median over the rounds, new / old of the medians, and the spread of new / old over the
paired rounds; the verdict lists the rows worse by more than 5%. Every row is a cost (time or
bytes per call, or round trips) over its baseline, so higher is worse. Control rows are two
baselines of identical code in both trees: how far they move is the noise of the sitting.
Memory and round trips are counted, not timed, and need one round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import Series, cleanup, pinned, redis_server, table  # noqa: E402

LIMIT = 1.05
"""A row worse than this, new / old by the median, is named in the verdict."""

CONTROL = "control: "
"""Rows of identical code in both trees (two baselines against each other)."""

FLOORS = ("floor (SET NX + SET)", "floor (GET)")
SAME_CODE = ("Powertools", "bare socket (SET NX + SET)", "bare socket (GET)")

SKIPPED = (
    "pieces, Python per call: its 'least' calls the library's own internals, no identical"
    " baseline (bench/python_per_call.py --against REV --instructions counts it)",
    "end to end, effects taking 2 and 10 ms, and the prefork pool: the same task's sleeps and"
    " scheduler set those; the solo task whose effects do nothing is the worst case of the ratio",
    "canonical JSON: bench/encoder.py measures two encoders of one checkout, not effectq against a baseline",
)


def _paths(group: str, first: dict[str, Series], replay: dict[str, Series]) -> dict[str, float]:
    """Each system's p50 over its path's floor (the floor's own row left out)."""
    out = {}
    for path, series in (("first time", first), ("replay", replay)):
        floor = next(name for name in series if name in FLOORS)
        for name, s in series.items():
            if name != floor:
                control = CONTROL if name in SAME_CODE else ""
                out[f"{control}{group}, {path}: {name} / {floor}"] = s.us(50) / series[floor].us(50)
    return out


def latency(url: str, size: dict[str, Any]) -> dict[str, float]:
    import latency

    found = latency.measure(url, size["latency"])
    cleanup(url, *found["cleanup"])
    return _paths("latency", found["first"], found["replay"])


def async_latency(url: str, size: dict[str, Any]) -> dict[str, float]:
    import async_latency

    found = async_latency.measure(url, size["latency"])
    cleanup(url, *found["cleanup"])
    return _paths("async latency", found["first"], found["replay"])


def one_effect(url: str, size: dict[str, Any]) -> dict[str, float]:
    import one_effect

    raw = one_effect._child(url, size["latency"])  # this child is a process of its own already
    cleanup(url, *raw["cleanup"])
    series = {path: {name: Series(name, s) for name, s in raw[path].items()} for path in ("first", "replay")}
    out = _paths("one effect", series["first"], series["replay"])
    for name in (one_effect.FIRST, one_effect.REPLAY):
        out[f"one effect: {name}, round trips"] = raw["trips"][name]
    return out


def pieces(url: str, size: dict[str, Any]) -> dict[str, float]:
    import uuid

    import pieces
    import redis

    import effectq

    client = redis.Redis.from_url(url)
    store = effectq.RedisStore(client, namespace=f"bench-p-{uuid.uuid4().hex[:8]}")
    try:
        cpu = pieces.server_cpu(client, store, size["latency"])
        trips = pieces.round_trips(client, store, size["latency"])
    finally:
        store.close()
        client.close()
        cleanup(url, "pieces:*", "effectq:{bench-p-*")
    bare = trips["bare socket GET"].us(50)
    out = {
        "pieces, Redis CPU: claim of a free key / SET": cpu["claim of a free key"] / cpu["SET"],
        "pieces, Redis CPU: completion / SET": cpu["completion"] / cpu["SET"],
        "pieces, Redis CPU: claim of a completed key / GET": cpu["claim of a completed key (replay)"]
        / cpu["GET"],
        f"{CONTROL}pieces, one round trip: redis-py GET / bare socket GET": trips["redis-py GET"].us(50)
        / bare,
    }
    if "lane EVALSHA (return 1)" in trips:
        lane = trips["lane EVALSHA (return 1)"].us(50)
        out["pieces, one round trip: lane EVALSHA (return 1) / bare socket GET"] = lane / bare
    return out


def redelivery(url: str, size: dict[str, Any]) -> dict[str, float]:
    import redelivery

    out = {}
    for row in redelivery.measure(url, size["sizes"], size["repeat"]):
        n, fetched, single = row["n"], row["prefetch"], row["one by one"]
        out[f"redelivery, N = {n}: ms to resume / ms one claim per effect"] = fetched["ms"] / single["ms"]
        out[f"redelivery, N = {n}: round trips"] = fetched["trips"]
    return out


def contention(url: str, size: dict[str, Any]) -> dict[str, float]:
    import contention

    processes, out = size["processes"], {}
    for row in contention.measure(url, processes, size["keys"], size["rounds"]):
        assert row["executions"] == row["keys"], f"a key executed more than once or never: {row}"
        label = f"contention, {row['keys']} keys, {processes} processes: time per call / raw redis-py"
        out[label] = row["raw_per_s"] / row["effectq_per_s"]
    return out


def memory(url: str, size: dict[str, Any]) -> dict[str, float]:
    import memory

    found = memory.measure(url, size["memory"])
    out = {
        "memory: bytes of a completed record / the result alone": found["record"] / found["floor"],
        "memory: + its share of the run index / the result alone": (found["record"] + found["index"])
        / found["floor"],
    }
    if found["powertools"] is not None:
        out[f"{CONTROL}memory: Powertools record / the result alone"] = found["powertools"] / found["floor"]
    return out


def end_to_end(url: str, size: dict[str, Any]) -> dict[str, float]:
    import e2e

    out = {}
    every = ("none", "effectq", "floor") + (("powertools",) if e2e._has_powertools() else ())
    for effects, layers in ((3, every), (1, ("none", "effectq", "floor"))):
        rates = e2e._measure(url, size["tasks"], 3, 0.0, e2e.SOLO, layers, effects=effects)
        task = f"end to end, solo, {effects} effect{'s' * (effects > 1)} doing nothing"
        for layer in layers:
            if layer not in ("effectq", "floor"):
                out[f"{task}: time per task, effectq / {e2e.LABELS[layer]}"] = rates[layer] / rates["effectq"]
        out[f"{CONTROL}{task}: time per task, floor layer / no layer"] = rates["none"] / rates["floor"]
    return out


GROUPS: dict[str, tuple[Callable[[str, dict[str, Any]], dict[str, float]], bool]] = {
    "latency": (latency, True),
    "async latency": (async_latency, True),
    "one effect": (one_effect, True),
    "pieces": (pieces, True),
    "redelivery": (redelivery, False),
    "contention": (contention, False),
    "memory": (memory, False),
    "end to end": (end_to_end, False),
}
"""Each group: what a child measures, and whether it runs pinned off Redis' CPU (as in run.py)."""

COUNTED = ("memory",)
"""Groups whose figures are counted, not timed: one round is enough."""


def summarize(old: dict[str, list[float]], new: dict[str, list[float]]) -> list[dict[str, Any]]:
    """Per row: the median of each side, new / old of the medians, and the paired rounds' range."""
    rows = []
    for name in list(old) + [name for name in new if name not in old]:
        a, b = old.get(name, []), new.get(name, [])
        row: dict[str, Any] = {"row": name, "old": None, "new": None, "ratio": None, "spread": None}
        if a:
            row["old"] = statistics.median(a)
        if b:
            row["new"] = statistics.median(b)
        if a and b:
            row["ratio"] = row["new"] / row["old"] if row["old"] else float("nan")
            paired = [y / x for x, y in zip(a, b, strict=False) if x]
            row["spread"] = (min(paired), max(paired)) if paired else None
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]], old: str, new: str, limit: float = LIMIT) -> str:
    """The table and the verdict line."""

    def cell(value: float | None, digits: int = 3) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    lines = []
    for r in rows:
        spread = "—" if r["spread"] is None else f"{r['spread'][0]:.3f}–{r['spread'][1]:.3f}"
        lines.append((r["row"], cell(r["old"]), cell(r["new"]), cell(r["ratio"]), spread))
    headers = ["row (a cost over its baseline: higher is worse)", f"old: {old}", f"new: {new}"]
    out = [table([*headers, "new / old", "spread of new / old (paired rounds)"], lines), ""]
    compared = [r for r in rows if r["ratio"] is not None and not r["row"].startswith(CONTROL)]
    worse = [r for r in compared if r["ratio"] > limit]
    percent = f"{(limit - 1) * 100:g}%"
    if worse:
        named = "; ".join(f"{r['row']} ({r['ratio']:.3f})" for r in worse)
        out.append(
            f"Verdict: {len(worse)} of {len(compared)} rows worse than {percent} by the median: {named}."
        )
    else:
        out.append(f"Verdict: none of {len(compared)} rows is worse than {percent} by the median.")
    controls = [r["ratio"] for r in rows if r["ratio"] is not None and r["row"].startswith(CONTROL)]
    if controls:
        out.append(f"Controls (identical code in both trees) moved {min(controls):.3f}–{max(controls):.3f}.")
    one_sided = [r["row"] for r in rows if r["ratio"] is None]
    if one_sided:
        out.append("Measured on one side only (the other's API lacks it): " + "; ".join(one_sided) + ".")
    return "\n".join(out)


def child(group: str, url: str, size_name: str, tree: Path) -> None:
    from run import SIZES

    import effectq

    where = Path(effectq.__file__).resolve()
    assert where.is_relative_to(tree.resolve()), f"effectq imported from {where}, not from {tree}"
    print(json.dumps(GROUPS[group][0](url, SIZES[size_name])))


def spawn(tree: Path, group: str, url: str, size: str) -> dict[str, float]:
    path = os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", group, url, size, str(tree)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode:
        raise SystemExit(f"{group} on {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@contextlib.contextmanager
def tree_of(rev: str) -> Iterator[Path]:
    """A checkout already made, or ``rev`` in a temporary detached worktree."""
    if Path(rev).is_dir():
        yield Path(rev).resolve()
        return
    from python_per_call import checkout

    with checkout(rev) as made:
        yield made.resolve()


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("old", help="a revision or a checkout")
    parser.add_argument("new", nargs="?", default=str(HERE.parent), help="default: this checkout")
    parser.add_argument("--rounds", type=int, default=6, help="children per tree and group, taking turns")
    parser.add_argument("--size", choices=("smoke", "small"), default="small")
    parser.add_argument("--group", action="append", choices=list(GROUPS), help="only this group (repeatable)")
    parser.add_argument("--redis-url", help="a Redis to measure against (default: a redis-server of its own)")
    if (argv if argv is not None else sys.argv[1:])[:1] == ["--child"]:
        group, url, size, tree = (argv or sys.argv[1:])[1:5]
        child(group, url, size, Path(tree))
        return 0
    args = parser.parse_args(argv)
    began = time.monotonic()
    found: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tree_of(args.old) as old, tree_of(args.new) as new, redis_server(args.redis_url) as url:
        trees = {"old": old, "new": new}
        for group in args.group or GROUPS:
            rounds = 1 if group in COUNTED else args.rounds
            for n in range(rounds):
                for side in ("old", "new") if n % 2 == 0 else ("new", "old"):
                    at = f"[versus {time.monotonic() - began:5.0f} s]"
                    print(f"{at} {group}, round {n + 1}/{rounds}, {side}", file=sys.stderr, flush=True)
                    with pinned() if GROUPS[group][1] else contextlib.nullcontext():  # the child inherits it
                        for row, value in spawn(trees[side], group, url, args.size).items():
                            found[side].setdefault(row, []).append(value)
    print(f"### {args.old} against {args.new}: {args.size} size, {args.rounds} rounds, medians\n")
    print(render(summarize(found["old"], found["new"]), args.old, args.new))
    print("\nNot compared: " + "; ".join(SKIPPED) + ".")
    print(f"\nAll of the above took {time.monotonic() - began:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
