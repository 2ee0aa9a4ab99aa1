"""The named chaos scenarios: each passes with effectq and does harm without it, at its CI size.

Each scenario mirrors a setting where task queues ran effects twice in production
(see docs/testing.md). A run with effectq must prove every effect applied exactly
once, with the scenario's fault counted on the report; the same run with effectq
off must show duplicates, so the scenario provably bites.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pytest

from effectq.testing.chaos.__main__ import INFRASTRUCTURE, exit_status, main, options_from, parser
from effectq.testing.chaos.redis_server import RedisServer
from effectq.testing.chaos.runner import CONFIGURATIONS, Options, Report, run_chaos
from effectq.testing.chaos.scenarios import SCENARIOS
from tests.conftest import REDIS_URL

AMQP_URL = os.environ.get("EFFECTQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def _options(name: str, tmp_path: Path, *argv: str) -> Options:
    args = parser().parse_args(
        [name, "--redis-url", REDIS_URL, "--amqp-url", AMQP_URL, "--log-dir", str(tmp_path), *argv]
    )
    return options_from(args)


def _run(options: Options, **changes: object) -> Report:
    """Run the scenario; every run longer than two progress periods printed its progress lines."""
    lines: list[str] = []
    changes.setdefault("progress", 1.0)
    report = run_chaos(dataclasses.replace(options, **changes), progress=lines.append)  # type: ignore[arg-type]
    print(report.render())
    progress = [line for line in lines if "tasks done" in line]
    if report.elapsed > 3.0:
        assert progress and "kills" in progress[-1] and "duplicates so far" in progress[-1], lines
    return report


def _passes(report: Report) -> None:
    assert not report.timed_out, report.render() + "\n" + "\n".join(report.tail.values())
    assert report.verdict is not None and report.verdict.ok, report.render()
    assert report.wrong == 0 and report.not_done == 0
    assert report.passed and exit_status(report) == 0, report.render()


def _bites(report: Report) -> None:
    assert not report.timed_out, report.render()
    assert report.duplicates > 0, report.render()
    assert exit_status(report) == 0 and "WITHOUT EFFECTQ" in report.conclusion()


def test_every_scenario_names_a_configuration_and_both_sizes() -> None:
    """Each scenario is one table entry: a known configuration, Options fields only, a ci and a long size."""
    fields = {f.name for f in dataclasses.fields(Options)}
    for name, scenario in SCENARIOS.items():
        assert scenario.configuration in CONFIGURATIONS, name
        assert set(scenario.options) <= fields, name
        assert {"ci", "long"} <= set(scenario.sizes), name
        for size in ("ci", "long"):
            assert {"tasks", "effects", "workers", "timeout"} <= set(scenario.size(size)), name
        assert scenario.summary and scenario.mirrors, name


def test_scenario_presets_yield_to_the_command_line(tmp_path: Path) -> None:
    """A scenario sets its options and sizes; explicit options and sizes on the command line win."""
    retry = _options("retry", tmp_path)
    assert (retry.scenario, retry.configuration, retry.retry, retry.retry_after) == (
        "retry",
        "celery-redis",
        "mixed",
        1,
    )
    assert retry.kill_every == (2.0, 4.0)
    changed = _options("retry", tmp_path, "--kill-every", "1:2", "--tasks", "3", "--size", "long")
    assert (changed.kill_every, changed.tasks, changed.effects) == ((1.0, 2.0), 3, 4)
    assert _options("prefork-children", tmp_path, "--no-kills").kill_every is None
    long = _options("visibility-timeout", tmp_path, "--size", "long")
    assert (long.tasks, long.timeout) == (200, 1200.0)


def test_an_unreachable_redis_is_one_line_and_its_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    """Redis not answering: exit status 4 and one line on stderr naming it, no traceback, no report."""
    status = main(["visibility-timeout", "--redis-url", "redis://127.0.0.1:9/0", "--progress", "0"])
    captured = capsys.readouterr()
    assert status == INFRASTRUCTURE == 4
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("effectq chaos: Redis") and "redis://127.0.0.1:9/0 did not answer" in lines[0]


def test_an_unreachable_broker_is_one_line_and_its_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    """RabbitMQ not answering: exit status 4 and one line naming the broker (its password masked)."""
    argv = ["celery-rabbitmq", "--redis-url", REDIS_URL, "--amqp-url", "amqp://guest:secret@127.0.0.1:9//"]
    status = main([*argv, "--progress", "0"])
    captured = capsys.readouterr()
    assert status == INFRASTRUCTURE
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "the RabbitMQ broker at amqp://guest:***@127.0.0.1:9// did not answer" in lines[0]
    assert "secret" not in captured.err


def test_redis_lost_mid_run_is_an_infrastructure_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Redis of the ledger and broker killed while the run goes: exit 4 and one line, not a verdict."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        killer = threading.Timer(6.0, server.kill)
        killer.start()
        argv = ["dramatiq-redis", "--redis-url", server.url, "--tasks", "40", "--workers", "1"]
        status = main([*argv, "--pause", "0.5", "--no-kills", "--log-dir", str(tmp_path), "--progress", "0"])
        killer.join()
    finally:
        server.stop()
    captured = capsys.readouterr()
    assert status == INFRASTRUCTURE, captured
    lines = captured.err.strip().splitlines()
    assert lines[-1].startswith("effectq chaos: Redis (the ledger) at redis://127.0.0.1:"), captured.err
    assert "Traceback" not in captured.err and "effectq chaos\n" not in captured.out


def test_visibility_timeout(tmp_path: Path) -> None:
    """Tasks outliving the Redis broker's visibility timeout run twice at once; each effect applies once."""
    options = _options("visibility-timeout", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.redeliveries > 0 and report.kills == 0  # the broker alone delivered the tasks again
    _bites(_run(options, effectq=False))


def test_eta_storm(tmp_path: Path) -> None:
    """Countdown tasks beyond the visibility timeout fire on several workers at once; each effect once."""
    options = _options("eta-storm", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.redeliveries > 0 and report.kills == 0
    _bites(_run(options, effectq=False))


def test_retry(tmp_path: Path) -> None:
    """self.retry(countdown) and autoretry_for + retry_backoff after the first effect, under SIGKILLs.

    A progress line comes every few seconds while it runs."""
    options = _options("retry", tmp_path)
    lines: list[str] = []
    report = run_chaos(dataclasses.replace(options, progress=2.0), progress=lines.append)
    print(report.render())
    _passes(report)
    assert report.retry_asks == options.tasks and report.retries >= options.tasks
    assert report.kills > 0
    assert lines and "tasks done" in lines[-1] and "duplicates so far" in lines[-1]
    _bites(_run(options, effectq=False))


def test_chord(tmp_path: Path) -> None:
    """Chords under SIGKILLs of busy workers: the header tasks' effects and the callback's one effect per
    chord (keyed by the chord's group id, ``chord:{request.group}``) apply once each; without effectq the
    callback's effect applies twice."""
    options = _options("chord", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.kills > 0 and report.options.chords == 3
    harmed = _run(options, effectq=False)
    _bites(harmed)
    assert "of chord callbacks" in harmed.render()


def test_prefork_children(tmp_path: Path) -> None:
    """Only prefork pool children running a task SIGKILLed (task_reject_on_worker_lost): each effect once."""
    options = _options("prefork-children", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.child_kills > 0 and report.kills == 0
    _bites(_run(options, effectq=False))


def test_pools(tmp_path: Path) -> None:
    """A threads-pool and a gevent-pool worker on RabbitMQ, two tasks per process, SIGKILLed while
    they run tasks: each effect once; without effectq, duplicates. (Each kill reaches a task: a
    kill of a worker still booting, as random victims were, redelivers nothing, and a run of only
    such kills proved nothing.)"""
    pytest.importorskip("gevent")
    options = _options("pools", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.redeliveries >= report.kills > 0
    assert (options.pool_of(0), options.pool_of(1)) == ("threads", "gevent")
    assert "succeeded" in (tmp_path / "w1.log").read_text()  # the gevent worker ran tasks
    _bites(_run(options, effectq=False))


def test_shutdown_of_prefork_workers(tmp_path: Path) -> None:
    """Cold (SIGQUIT) and warm (SIGTERM, SIGKILL after the grace) shutdowns of prefork workers inside
    effects, workers restarted: each effect once."""
    report = _run(_options("shutdown", tmp_path, "--pool", "prefork"))
    _passes(report)
    assert report.terms > 0 and report.quits > 0


def test_shutdown(tmp_path: Path) -> None:
    """Cold and warm shutdowns of a solo and a prefork worker inside effects: each effect once. (A
    cold shutdown of a solo worker raises NotImplementedError into the running effect from
    Celery's signal handler, after its side effect: it must count as maybe applied.) Without
    effectq, the task a cold shutdown interrupts runs again from the start."""
    options = _options("shutdown", tmp_path)
    report = _run(options)
    assert report.terms > 0 and report.quits > 0
    _passes(report)
    _bites(_run(options, effectq=False))


def test_dramatiq_redis(tmp_path: Path) -> None:
    """Dramatiq's RedisBroker, a 2 s heartbeat timeout, workers SIGKILLed and frozen past it: once each."""
    options = _options("dramatiq-redis", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.pauses > 0 and report.kills > 0
    _bites(_run(options, effectq=False))


def test_dramatiq_retries(tmp_path: Path) -> None:
    """Retry(delay) and the Retries middleware's backoff after the first effect, under SIGKILLs: once each."""
    options = _options("dramatiq-retries", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.retry_asks == options.tasks and report.retries >= options.tasks
    _bites(_run(options, effectq=False))


def test_dramatiq_time_limit(tmp_path: Path) -> None:
    """A time limit landing inside an effect, before or after its side effect: reconcile tells which."""
    options = _options("dramatiq-time-limit", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.time_limits >= options.tasks and report.kills == 0
    assert report.reconciled > 0  # the interrupted effects that had applied were found, not repeated
    _bites(_run(options, effectq=False))


def test_redis_pause(tmp_path: Path) -> None:
    """The store's Redis frozen past the lease and the visibility timeout while effects are in
    flight: the broker hands the stalled tasks to another worker, and each effect applies once;
    without effectq, both copies of a stalled task apply."""
    options = _options("redis-pause", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.store_pauses > 0 and report.redeliveries > 0 and report.kills == 0
    harmed = _run(options, effectq=False)
    _bites(harmed)
    assert harmed.kills == 0  # the harm is the freeze's


def test_partition(tmp_path: Path) -> None:
    """One busy worker cut off from the store's Redis past the lease while its task runs elsewhere:
    the stale holder is fenced out, each effect once; without effectq, both copies apply."""
    options = _options("partition", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.partitions > 0 and report.redeliveries > 0
    harmed = _run(options, effectq=False)
    _bites(harmed)
    assert harmed.kills == 0  # the harm is the partition's


def test_redis_restart(tmp_path: Path) -> None:
    """The store's Redis (append-only) SIGKILLed and restarted mid-run, under SIGKILLs: once each."""
    options = _options("redis-restart", tmp_path)
    report = _run(options)
    _passes(report)
    assert report.store_restarts > 0 and report.kills > 0
    _bites(_run(options, effectq=False))


def test_redis_restart_without_persistence_says_so_before_it_starts(tmp_path: Path) -> None:
    """A store Redis restarted with persistence off: before any task runs, the run says what
    ``effectq doctor`` says of such a server (a restart loses every record), and the report repeats it."""
    # Two tasks of three effects 0.5 s apart keep a worker busy for 1.5 s at the least, after it
    # started, so a restart every second lands mid-run however fast the machine is (every 5 s did
    # not always); without kills, the restarts are the only thing slowing the run.
    argv = ("--store-persistence", "off", "--tasks", "2", "--effects", "3", "--no-kills")
    argv += ("--pause", "0.5", "--redis-restart", "1")
    # Effects that read and write the restarted Redis would only stall this run: it is about the warning.
    options = dataclasses.replace(_options("redis-restart", tmp_path, *argv), reads=False)
    assert options.persistence is False
    lines: list[str] = []
    report = run_chaos(options, progress=lines.append)
    print(report.render())
    assert lines and lines[0].startswith("effectq chaos: warning: the store's Redis 127.0.0.1:")
    assert "appendonly no, no persistence at all: a restart loses every record" in lines[0]
    assert report.warnings and report.warnings[0] in lines[0] and "warning" in report.render()
    assert report.store_restarts > 0
