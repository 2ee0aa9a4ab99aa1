"""``python -m effectq.chaos``: kill real workers at random and count every application.

Exit status: 0 when every effect applied exactly once and the chaos reached the
tasks (with ``--effectq off``: when the chaos caused duplicates); 1 on any
duplicate or missing effect; 2 when the run proved nothing (no redelivery, or
no duplicate without effectq) or timed out.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace

from .runner import (
    AMQP_URL,
    CONFIGURATIONS,
    REDIS_URL,
    SIZE_TIMEOUTS,
    SIZES,
    TIMEOUT,
    Options,
    Report,
    run_chaos,
)

__all__ = ["main", "parser"]


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="effectq chaos",
        description="Run real Celery or Dramatiq workers, SIGKILL them at random, and check on a ledger "
        "that every effect applied exactly once.",
    )
    p.add_argument("configuration", nargs="?", default="celery-redis", choices=sorted(CONFIGURATIONS))
    p.add_argument(
        "--size", choices=sorted(SIZES), default="ci", help="preset tasks/effects/workers (default ci)"
    )
    p.add_argument("--tasks", type=int, help="tasks to enqueue (overrides --size)")
    p.add_argument("--effects", type=int, help="effects per task (overrides --size)")
    p.add_argument("--workers", type=int, help="worker processes (overrides --size)")
    p.add_argument("--effectq", choices=("on", "off"), default="on", help="off: the same tasks, unguarded")
    p.add_argument(
        "--compare", action="store_true", help="run again with effectq off and show what it suffered"
    )
    p.add_argument("--kill-every", type=_span, default=(1.5, 3.5), metavar="MIN:MAX",
                   help="seconds between two SIGKILLs of a random worker (default 1.5:3.5)")  # fmt: skip
    p.add_argument("--no-kills", action="store_true", help="no SIGKILLs (other faults only)")
    p.add_argument("--redis-restart", type=float, metavar="SECONDS",
                   help="put the store on its own redis-server and restart it every SECONDS")  # fmt: skip
    p.add_argument("--sigstop", type=float, metavar="SECONDS",
                   help="SIGSTOP a random worker past its lease every SECONDS, then resume it")  # fmt: skip
    p.add_argument("--cut", type=float, metavar="SECONDS", help="cut every broker connection every SECONDS")
    p.add_argument("--faults", default="", metavar="SPEC",
                   help="faults workers inject into themselves, e.g. after_effect:0.02:kill")  # fmt: skip
    p.add_argument("--pause", type=float, default=0.2, help="seconds between two effects of a task")
    p.add_argument("--lease", type=float, default=2.0, help="the effects' lease in seconds")
    p.add_argument(
        "--redis-url", "--url", default=REDIS_URL, help="Redis for the ledger, store and Redis broker"
    )
    p.add_argument("--namespace", "-n", help="ignored: each run works in a namespace of its own")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--amqp-url", default=AMQP_URL, help="RabbitMQ broker")
    p.add_argument("--timeout", type=float, help="give up after SECONDS (default: the size's)")
    p.add_argument("--seed", type=int, help="seed the victims and moments")
    p.add_argument("--log-dir", help="keep worker logs here")
    p.add_argument("--workload", default="effectq.chaos.workload", metavar="MODULE",
                   help="the module workers run (yours: see docs/testing.md)")  # fmt: skip
    return p


def options_from(args: argparse.Namespace) -> Options:
    size = SIZES[args.size]
    return Options(
        configuration=args.configuration,
        tasks=args.tasks or size["tasks"],
        effects=args.effects or size["effects"],
        workers=args.workers or size["workers"],
        effectq=args.effectq == "on",
        kill_every=None if args.no_kills else args.kill_every,
        redis_restart=args.redis_restart,
        sigstop=args.sigstop,
        cut=args.cut,
        faults=args.faults,
        pause=args.pause,
        lease=args.lease,
        redis_url=args.redis_url,
        amqp_url=args.amqp_url,
        timeout=args.timeout or SIZE_TIMEOUTS.get(args.size, TIMEOUT),
        seed=args.seed,
        log_dir=args.log_dir,
        workload=args.workload,
    )


def exit_status(report: Report) -> int:
    """0 proved, 1 a duplicate or missing effect, 2 proved nothing or timed out."""
    if report.timed_out or not report.bit:
        return 2
    if not report.options.effectq:
        return 0 if report.duplicates else 2
    return 0 if report.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos runner with command-line arguments; returns the exit status."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    options = options_from(args)
    reports = [run_chaos(options)]
    status = exit_status(reports[0])
    _show(reports[0], as_json=args.json)
    if args.compare and options.effectq:
        reports.append(run_chaos(replace(options, effectq=False)))
        _show(reports[1], as_json=args.json)
        if exit_status(reports[1]) != 0:
            status = max(status, 2)
    return status


def _show(report: Report, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.as_dict(), sort_keys=True), flush=True)
    else:
        print(report.render() + "\n", flush=True)


if __name__ == "__main__":
    sys.exit(main())
