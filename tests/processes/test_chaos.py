"""The chaos runner: real workers SIGKILLed at random; every effect applies exactly once.

Celery + Redis broker and Dramatiq + RabbitMQ run the ``ci`` size (300 effects,
about 40 s each here); the other faults and the unguarded run use smaller runs.
``python -m effectq.chaos --size long`` (5,000 effects) is the documented long run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from effectq.testing.chaos.__main__ import exit_status, main, options_from, parser
from effectq.testing.chaos.runner import SIZES, Options, Report, run_chaos
from effectq.testing.ledger import Verdict
from tests.conftest import REDIS_URL

AMQP_URL = os.environ.get("EFFECTQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

CI = SIZES["ci"]

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(300)]


def _run(tmp_path: Path, configuration: str, **options: object) -> Report:
    report = run_chaos(
        Options(
            configuration=configuration,
            redis_url=REDIS_URL,
            amqp_url=AMQP_URL,
            log_dir=str(tmp_path),
            timeout=150,
            **options,  # type: ignore[arg-type]
        )
    )
    print(report.render())
    return report


def _assert_proved(report: Report) -> None:
    assert not report.timed_out, report.render() + "\n" + "\n".join(report.tail.values())
    assert report.verdict is not None
    assert report.verdict.ok, report.render()
    assert report.kills > 0
    assert report.redeliveries > 0  # the chaos reached the tasks
    assert report.passed
    assert exit_status(report) == 0


def test_celery_redis_broker_under_kills(tmp_path: Path) -> None:
    """Celery + Redis broker, workers SIGKILLed at random: every effect applied exactly once."""
    _assert_proved(_run(tmp_path, "celery-redis", **CI))


def test_dramatiq_rabbitmq_under_kills_and_crash_window_faults(tmp_path: Path) -> None:
    """Dramatiq + RabbitMQ, random SIGKILLs and self-kills between the side effect and its record."""
    report = _run(tmp_path, "dramatiq-rabbitmq", **CI, faults="after_effect:0.02:kill")
    _assert_proved(report)


def test_store_restart_sigstop_and_connection_cuts(tmp_path: Path) -> None:
    """The store's Redis restarted, a worker paused past its lease, broker connections cut: still once."""
    report = _run(tmp_path, "celery-rabbitmq", tasks=20, effects=4, redis_restart=10, sigstop=10, cut=8)
    _assert_proved(report)
    assert (report.store_restarts, report.pauses, report.cuts) > (0, 0, 0)


def test_without_effectq_the_chaos_bites(tmp_path: Path) -> None:
    """The same chaos with effectq off repeats effects: the runner's kills are real."""
    report = _run(tmp_path, "celery-redis", tasks=20, effects=5, effectq=False)
    assert report.redeliveries > 0
    assert report.duplicates > 0, report.render()
    assert "WITHOUT EFFECTQ" in report.conclusion()


def test_cli_sizes_and_overrides() -> None:
    """--size picks a preset; explicit numbers override it; --no-kills turns kills off."""
    options = options_from(
        parser().parse_args(["dramatiq-redis", "--size", "long", "--workers", "4", "--no-kills"])
    )
    assert (options.configuration, options.tasks * options.effects, options.workers) == (
        "dramatiq-redis",
        5000,
        4,
    )
    assert options.kill_every is None
    ci = options_from(parser().parse_args([]))
    assert ci.tasks * ci.effects >= 300
    assert ci.kill_every == (1.5, 3.5)


def test_exit_status_reads_the_report() -> None:
    """0 proved; 1 a duplicate or missing effect; 2 nothing proved or timed out."""
    ok = Verdict(expected=2, applications=2)
    dup = Verdict(expected=2, applications=3, duplicates={"0:0": 2})
    assert exit_status(Report(Options(), verdict=ok, deliveries=3, finished=2)) == 0
    assert exit_status(Report(Options(), verdict=dup, deliveries=3, finished=2)) == 1
    assert exit_status(Report(Options(), verdict=ok, deliveries=2, finished=2)) == 2  # no redelivery
    assert exit_status(Report(Options(effectq=False), verdict=dup, deliveries=3, finished=2)) == 0
    assert exit_status(Report(Options(effectq=False), verdict=ok, deliveries=3, finished=2)) == 2
    assert exit_status(Report(Options(), verdict=ok, deliveries=3, finished=1, timed_out=True)) == 2


def test_main_prints_the_report_and_exits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """python -m effectq.chaos prints the report and returns its status (a tiny run)."""
    argv = [
        "celery-redis",
        "--tasks",
        "6",
        "--effects",
        "2",
        "--workers",
        "1",
        "--pause",
        "0.5",
        "--kill-every",
        "1.5:2",
    ]
    status = main([*argv, "--redis-url", REDIS_URL, "--log-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "effectq chaos" in out
    assert "duplicates     0" in out
    assert status in (0, 2)  # 2 only if no kill happened to land on a running task


def test_effectq_command_dispatches_to_the_runner(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`effectq --url URL chaos ... --json` runs the same runner and prints its report as JSON."""
    from effectq.cli import main as effectq_main

    sizes = ["--tasks", "2", "--effects", "1", "--workers", "1", "--no-kills", "--pause", "0"]
    argv = ["--url", REDIS_URL, "chaos", "dramatiq-redis", *sizes, "--json", "--log-dir", str(tmp_path)]
    status = effectq_main(argv)
    report = json.loads(capsys.readouterr().out)
    assert (report["configuration"], report["finished"], report["duplicates"]) == ("dramatiq-redis", 2, 0)
    assert status == 2  # no kills: the run proved nothing, and says so
    assert "PROVED NOTHING" in report["conclusion"]
