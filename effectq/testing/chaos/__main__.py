"""``python -m effectq.chaos``: run a named chaos scenario on real workers and count every application.

Exit status: 0 when every effect applied exactly once and the chaos reached the
tasks (with ``--effectq off``: when the chaos did harm); 1 on any duplicate,
missing effect or wrong result; 2 when the run proved nothing (no redelivery, or
no harm without effectq) or timed out; 4 when Redis or the broker did not answer
(one line on stderr says which).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .options import AMQP_URL, KILL_WITH, REDIS_URL, Options
from .reach import Unreachable
from .report import Report
from .runner import run_chaos
from .scenarios import SCENARIOS
from .user import load, parse_send

__all__ = ["INFRASTRUCTURE", "main", "parser"]

INFRASTRUCTURE = 4
"""The exit status when Redis or the broker did not answer (``effectq``'s code for an unreachable Redis)."""


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    return float(low), float(high or low)


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KILL_WITH]
    if not kinds or unknown:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(KILL_WITH)}")
    return kinds


def _epilog() -> str:
    width = max(len(n) for n in SCENARIOS)
    lines = ["scenarios:"]
    for name, scenario in SCENARIOS.items():
        text = textwrap.wrap(scenario.summary, 100 - width)
        lines += [f"  {(name if i == 0 else '').ljust(width)}  {part}" for i, part in enumerate(text)]
    lines += ["", "exit status: 0 proved, 1 a duplicate, missing effect or wrong result, 2 proved nothing or "
              "timed out,", "4 Redis or the broker did not answer"]  # fmt: skip
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="effectq chaos",
        description="Run a named scenario on real Celery or Dramatiq workers (kills, shutdowns, broker "
        "timeouts, retries, a frozen Redis...) and check on a ledger that every effect applied exactly once.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenario", nargs="?", default="celery-redis", choices=list(SCENARIOS), metavar="SCENARIO",
                   help="a scenario or plain configuration (default celery-redis; see below)")  # fmt: skip
    p.add_argument(
        "--size",
        choices=("small", "ci", "long"),
        default="ci",
        help="the scenario's preset size (default ci)",
    )
    p.add_argument("--tasks", type=int, help="tasks to enqueue (overrides --size)")
    p.add_argument("--effects", type=int, help="effects per task (overrides --size)")
    p.add_argument("--workers", type=int, help="worker processes (overrides --size)")
    p.add_argument("--effectq", choices=("on", "off"), default="on", help="off: the same tasks, unguarded")
    p.add_argument(
        "--compare", action="store_true", help="run again with effectq off and show the harm it suffers"
    )
    p.add_argument("--kill-every", type=_span, metavar="MIN:MAX",
                   help="seconds between two faults (default 1.5:3.5, or the scenario's)")  # fmt: skip
    p.add_argument("--kill-with", type=_kinds, metavar="KINDS",
                   help=f"what the faults do, in turn: {', '.join(KILL_WITH)} (default kill)")  # fmt: skip
    p.add_argument("--target", choices=("any", "busy"),
                   help="whom a fault strikes: any worker, or one running a task (default any)")  # fmt: skip
    p.add_argument("--no-kills", action="store_true", help="no kills or shutdowns (other faults only)")
    p.add_argument("--redis-restart", type=float, metavar="SECONDS",
                   help="put the store on its own redis-server and restart it every SECONDS")  # fmt: skip
    p.add_argument("--store-persistence", choices=("aof", "off"), default="aof",
                   help="the store's own redis-server: append-only (default), or no persistence")  # fmt: skip
    p.add_argument("--store-pause", type=float, metavar="SECONDS",
                   help="the store on its own redis-server, frozen past the lease every SECONDS")  # fmt: skip
    p.add_argument("--partition", type=float, metavar="SECONDS",
                   help="cut a busy worker off the store (its own redis-server) every SECONDS")  # fmt: skip
    p.add_argument("--sigstop", type=float, metavar="SECONDS",
                   help="SIGSTOP a random worker past its lease every SECONDS, then resume it")  # fmt: skip
    p.add_argument("--cut", type=float, metavar="SECONDS", help="cut every broker connection every SECONDS")
    p.add_argument("--faults", default="", metavar="SPEC",
                   help="faults workers inject into themselves, e.g. after_effect:0.02:kill")  # fmt: skip
    p.add_argument("--pool", help="Celery pool, or a cycle of pools across workers: solo,prefork")
    p.add_argument("--concurrency", type=int, help="Celery pool size, or Dramatiq threads")
    p.add_argument("--visibility", type=float, metavar="SECONDS",
                   help="the Redis brokers' visibility / heartbeat timeout")  # fmt: skip
    p.add_argument("--pause", type=float, help="seconds between two effects of a task (default 0.2)")
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
    p.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                   help="a progress line on stderr every SECONDS (default 10; 0: none)")  # fmt: skip
    p.add_argument("--app", metavar="MODULE[:ATTR]",
                   help="your Celery app or Dramatiq broker module, run unchanged (with --send)")  # fmt: skip
    p.add_argument("--send", action="append", default=[], metavar="'TASK(ARGS)'",
                   help="a task of --app to send, e.g. 'shop.fulfil({unique})' ({n}: the task's number; "
                   "repeat for more, used in turn)")  # fmt: skip
    p.add_argument("--workload", default="effectq.testing.chaos.workload", metavar="MODULE",
                   help="the module workers run (yours: see docs/testing.md)")  # fmt: skip
    return p


_EXPLICIT = ("kill_every", "kill_with", "redis_restart", "store_pause", "partition", "sigstop", "cut", "pool",
             "concurrency", "visibility", "pause", "target")  # fmt: skip
"""Options a scenario presets and the command line may override."""


def options_from(args: argparse.Namespace) -> Options:
    scenario = SCENARIOS[args.scenario]
    size = scenario.size(args.size)
    values: dict[str, Any] = dict(scenario.options)
    values.update({k: getattr(args, k) for k in _EXPLICIT if getattr(args, k) is not None})
    if args.no_kills:
        values["kill_every"] = None
    return Options(
        configuration=scenario.configuration,
        scenario=args.scenario,
        tasks=args.tasks or size["tasks"],
        effects=args.effects or size["effects"],
        workers=args.workers or size["workers"],
        effectq=args.effectq == "on",
        faults=args.faults,
        lease=args.lease,
        redis_url=args.redis_url,
        amqp_url=args.amqp_url,
        timeout=args.timeout or size["timeout"],
        seed=args.seed,
        log_dir=args.log_dir,
        workload=args.workload,
        progress=args.progress,
        persistence=args.store_persistence == "aof",
        app=args.app or "",
        send=tuple(args.send),
        **values,
    )


def exit_status(report: Report) -> int:
    """0 proved, 1 a duplicate, missing effect or wrong result, 2 proved nothing or timed out."""
    if report.timed_out or not report.bit:
        return 2
    if not report.options.effectq:
        return 0 if report.harmed else 2
    return 0 if report.passed else 1


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos runner with command-line arguments; returns the exit status."""
    p = parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    options = options_from(args)
    if options.app:
        if not options.send:
            p.error("--app needs at least one --send 'task_name(arguments...)'")
        if args.compare or not options.effectq:
            p.error(
                "--app runs your tasks as they are, with effectq: --compare and --effectq off need "
                "the runner's own workload"
            )
        try:
            for template in options.send:
                parse_send(template)
            target = load(options.app)
        except (ImportError, ValueError) as exc:
            p.error(str(exc))
        options = replace(options, configuration=target.configuration, scenario=options.app)
    for pool in {options.pool_of(i) for i in range(options.workers)} & {"gevent", "eventlet"}:
        if importlib.util.find_spec(pool) is None:
            p.error(f"--pool {pool} needs {pool} installed in this environment (pip install {pool})")
    runs = [options]
    if args.compare and options.effectq:
        runs.append(replace(options, effectq=False))
    status = 0
    for number, run in enumerate(runs):
        try:
            report = run_chaos(run, progress=_progress)
        except Unreachable as exc:
            print(f"effectq chaos: {exc}", file=sys.stderr, flush=True)
            return INFRASTRUCTURE
        _show(report, as_json=args.json)
        if number == 0:
            status = exit_status(report)
        elif exit_status(report) != 0:  # the comparison did no harm: the scenario proved nothing
            status = max(status, 2)
    return status


def _show(report: Report, *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.as_dict(), sort_keys=True), flush=True)
    else:
        print(report.render() + "\n", flush=True)


if __name__ == "__main__":
    sys.exit(main())
