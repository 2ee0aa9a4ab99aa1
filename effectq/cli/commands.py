"""The commands' options: what ``effectq --help`` shows, without loading what the commands run.

Each command names its handler as ``module:function`` of this package; :func:`handler`
imports it when the command runs, so ``--help`` and ``--version`` load neither the
store nor the admin functions.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .output import duration_arg

if TYPE_CHECKING:
    from .session import Session

__all__ = ["DEFAULT_LIMIT", "handler", "register"]

DEFAULT_LIMIT = 100


def register(commands: Any, common: argparse.ArgumentParser) -> None:
    """Add every command of the operators' CLI to ``commands`` (argparse subparsers)."""
    _records(commands, common)
    _upkeep(commands, common)
    _doctor(commands, common)


def handler(name: str) -> Callable[[Session], int]:
    """The function a command's ``module:function`` names."""
    module, function = name.split(":")
    run: Callable[[Session], int] = getattr(import_module(f".{module}", __package__), function)
    return run


def _status(text: str) -> str:
    """A ``--status`` of ``effectq list``: a standing of the store, or ``all``."""
    from ..store.operators import Standing

    known = [s.value for s in Standing] + ["all"]
    if text not in known:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(known)})")
    return text


def _records(commands: Any, common: argparse.ArgumentParser) -> None:
    listing = commands.add_parser(
        "list",
        parents=[common],
        help="list records: what is in doubt or in flight, or any status",
        description="List effect records. Without --status: what is unknown or in flight (read from "
        "the indexes, fast on any size); with --run and no --status: every record of that run.",
    )
    listing.add_argument(
        "--status",
        action="append",
        type=_status,
        metavar="STATUS",
        help="unknown, in-flight, completed, released, failed or all "
        "(repeatable); completed, released and failed scan the namespace",
    )
    listing.add_argument("--run", metavar="RUN_ID", help="only this run's records")
    listing.add_argument("--name", metavar="EFFECT", help="only this effect's records")
    listing.add_argument(
        "--older-than",
        metavar="AGE",
        type=duration_arg,
        default=0.0,
        help="only records in their status this long (e.g. 10m, 2h, 7d)",
    )
    listing.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"at most this many (default {DEFAULT_LIMIT}; 0: no limit)",
    )
    listing.set_defaults(handler="records:run_list")

    show = commands.add_parser(
        "show",
        parents=[common],
        help="show one record, whole",
        description="Show one effect record: status, run, holder, why it is "
        "in doubt, the result's size, and how to settle it.",
    )
    show.add_argument("key", help="the effect key (as listed by effectq list)")
    show.add_argument("--result", action="store_true", help="also print the recorded result (JSON)")
    show.set_defaults(handler="records:run_show")

    resolve = commands.add_parser(
        "resolve",
        parents=[common],
        help="settle a record in doubt as applied or not applied",
        description="Settle an unknown record after checking the remote system. Compare-and-set: of "
        "two resolvers one wins; a completed, released or live record is refused.",
    )
    resolve.add_argument("key", help="the effect key")
    which = resolve.add_mutually_exclusive_group(required=True)
    which.add_argument("--applied", action="store_true", help="it applied: later calls replay, never re-run")
    which.add_argument("--not-applied", action="store_true", help="it did not: the next call applies it")
    resolve.add_argument("--result", metavar="JSON", help="with --applied: the result later calls get back")
    resolve.add_argument("--note", default="", help="who settles and why (kept on the record)")
    resolve.add_argument(
        "--retention",
        metavar="AGE",
        type=duration_arg,
        help="keep the settled record this long (default 7d)",
    )
    resolve.set_defaults(handler="records:run_resolve")


def _upkeep(commands: Any, common: argparse.ArgumentParser) -> None:
    stats = commands.add_parser(
        "stats",
        parents=[common],
        help="counts by status and effect, and the oldest unknown",
        description="Count records by status and effect name, and date the oldest unknown. Reads every "
        "record of the namespace; --no-scan reads only the indexes (unknown and in flight).",
    )
    stats.add_argument("--no-scan", action="store_true", help="only unknown and in-flight (no full scan)")
    stats.set_defaults(handler="upkeep:run_stats")

    purge = commands.add_parser(
        "purge",
        parents=[common],
        help="delete completed/released records of a run or older than an age",
        description="Delete settled records (completed, released) of one run, or unchanged for longer "
        "than an age. Never deletes an unknown or in-flight record. Without --yes, only says what it would "
        "delete. A purged completed effect applies again on its next call.",
    )
    purge.add_argument("--run", metavar="RUN_ID", help="only this run's records")
    purge.add_argument(
        "--older-than", metavar="AGE", type=duration_arg, help="only records unchanged this long"
    )
    purge.add_argument("--yes", action="store_true", help="delete (without it: a dry run)")
    purge.set_defaults(handler="upkeep:run_purge")


def _doctor(commands: Any, common: argparse.ArgumentParser) -> None:
    doctor = commands.add_parser(
        "doctor",
        parents=[common],
        help="check the Redis for what breaks at-most-once, and how to fix it",
        description="Check the Redis effectq points at: eviction policy, memory, persistence, replicas, "
        "scripts, clock, and what is in doubt in the namespace. Exit 1 when a check fails.",
    )
    doctor.add_argument(
        "--wait-replicas",
        type=int,
        default=None,
        metavar="N",
        help="the wait_replicas your stores use: every primary must have N replicas "
        "(default: EFFECTQ_WAIT_REPLICAS, else 0)",
    )
    doctor.set_defaults(handler="doctor:run_doctor")
