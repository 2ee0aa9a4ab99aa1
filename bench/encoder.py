"""The canonical JSON of an effect's input, before and after RFC 8785: µs per call, side by side.

Every first call of an effect with the default key writes its arguments' canonical
JSON and hashes it. This times what the call does now (``key_bytes``: RFC 8785's
bytes, and the legacy scheme's too where they differ) against the encoder as it was
before RFC 8785, read from git (``--old REV``; without git, the legacy scheme of the
current code stands in), interleaved in one run, on a few typical inputs and on the
rare ones whose bytes differ (a float from 1e-9 to 1e-4, member names beyond U+FFFF
that sort otherwise by UTF-16 code units).

    python bench/encoder.py [--number 20000] [--repeat 7] [--old REV]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import subprocess
import sys
import timeit
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from effectq import canonical

try:
    from common import table
except ImportError:  # imported as bench.encoder
    from .common import table

ROOT = Path(__file__).resolve().parent.parent
OLD_REV = "c7fe8d0"
"""The last commit whose canonical JSON was not RFC 8785's."""


@dataclasses.dataclass
class Item:
    sku: str
    qty: int
    price: float


INPUTS: dict[str, dict[str, Any]] = {
    "3 scalars (id, email, template)": {"user_id": 42, "email": "ann@example.com", "template": "welcome"},
    "order: nested dict, floats": {
        "order": {"id": 42, "amount": 19.99, "lines": [{"sku": "A1", "qty": 2, "price": 5.5}] * 3},
        "currency": "EUR",
    },
    "datetime, UUID, dataclasses": {
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "ident": uuid.UUID(int=7),
        "items": [Item("A1", 2, 5.5), Item("B2", 1, 12.25)],
    },
    "rare: a float from 1e-9 to 1e-4": {"rate": 1e-7, "user_id": 42},
    "rare: a name beyond U+FFFF": {"labels": {"\U0001f600": 1, "\ufb33": 2}, "user_id": 42},
}


def old_encoder(rev: str) -> tuple[Callable[[dict[str, Any]], bytes], str]:
    """``canonical_arguments`` as it was at ``rev``, or the legacy scheme now if git cannot say."""
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:effectq/canonical.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return (lambda arguments: canonical.canonical_arguments(arguments, legacy=True)), "legacy scheme, now"
    module = types.ModuleType("effectq._canonical_before")
    module.__package__ = "effectq"
    exec(compile(source, f"{rev}:effectq/canonical.py", "exec"), module.__dict__)
    return module.canonical_arguments, f"git {rev}"


def measure(number: int, repeat: int, rev: str) -> tuple[list[tuple[Any, ...]], str]:
    old, origin = old_encoder(rev)

    def new(arguments: dict[str, Any]) -> bytes:
        return canonical.key_bytes(arguments)[0]

    rows: list[tuple[Any, ...]] = []
    for name, arguments in INPUTS.items():
        timers = {
            "old": timeit.Timer(lambda arguments=arguments: old(arguments)),
            "new": timeit.Timer(lambda arguments=arguments: new(arguments)),
        }
        best = {label: float("inf") for label in timers}
        for _ in range(repeat):  # interleaved: the machine's load falls on both alike
            for label, timer in timers.items():
                best[label] = min(best[label], timer.timeit(number) / number * 1e6)
        same = "yes" if old(arguments) == new(arguments) else "no"
        rows.append((name, best["old"], best["new"], best["new"] / best["old"], same))
    return rows, origin


def report(rows: list[tuple[Any, ...]], origin: str) -> str:
    return "\n".join(
        [
            "### Canonical JSON of the input, before and after RFC 8785",
            "",
            table(
                [f"input (best of runs; old: {origin})", "old µs", "new µs", "new / old", "same bytes"],
                rows,
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--number", type=int, default=20_000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings of each, interleaved")
    parser.add_argument("--old", default=OLD_REV, help="the git revision of the old encoder")
    args = parser.parse_args()
    rows, origin = measure(args.number, args.repeat, args.old)
    sys.stdout.write(report(rows, origin) + "\n")


if __name__ == "__main__":
    main()
