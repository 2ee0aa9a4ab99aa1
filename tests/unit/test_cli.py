"""The effectq command line against a real Redis, with records of every status seeded."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

import effectq
from effectq.cli import Exit, main
from effectq.store import Standing
from effectq.testing import Seeded, seed_records


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


Cli = Callable[..., Ran]


@pytest.fixture
def cli(redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    """Run ``effectq ARGS --url URL --namespace NS`` in-process."""

    def run(*argv: str) -> Ran:
        code = main([*argv, "--url", redis_url, "--namespace", namespace])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        return Ran(code, captured.out, captured.err)

    return run


@pytest.fixture
def seeded(redis_store: effectq.RedisStore) -> Seeded:
    return seed_records(redis_store)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- list ---------------------------------------------------------------------------------


def test_list_shows_what_is_unsettled_by_default(cli: Cli, seeded: Seeded) -> None:
    """Without --status: every unknown and in-flight record, nothing settled."""
    ran = cli("list")
    assert ran.code == Exit.OK
    for key in seeded.keys(Standing.UNKNOWN) | seeded.keys(Standing.IN_FLIGHT):
        assert key in ran.out
    for key in seeded.keys(Standing.COMPLETED) | seeded.keys(Standing.RELEASED):
        assert key not in ran.out
    assert "TimeoutError: read timed out" in ran.out
    assert "effectq resolve KEY" in ran.err


def test_list_json_of_every_status(cli: Cli, seeded: Seeded) -> None:
    """--status all --json: every record, each with where it stands."""
    ran = cli("list", "--status", "all", "--json")
    assert ran.code == Exit.OK
    found = {item["key"]: item["standing"] for item in ran.json()}
    assert found == {key: where.value for key, where in seeded.standing_of().items()}


def test_list_filters(cli: Cli, redis_store: effectq.RedisStore, seeded: Seeded) -> None:
    """--run lists every status of one run; --status, --name and --older-than narrow it."""
    other = seed_records(redis_store, run_id="other-run", name="other.effect")
    run_keys = {item["key"] for item in cli("list", "--run", "other-run", "--json").json()}
    assert run_keys == set(other.standing_of())
    completed = cli("list", "--status", "completed", "--json").json()
    assert {item["key"] for item in completed} == {seeded.completed, other.completed}
    named = cli("list", "--status", "all", "--name", "other.effect", "--json").json()
    assert {item["key"] for item in named} == set(other.standing_of())
    assert cli("list", "--older-than", "1h", "--json").json() == []
    assert len(cli("list", "--status", "all", "--limit", "3", "--json").json()) == 3


def test_list_of_an_empty_namespace(cli: Cli) -> None:
    """Nothing to list is not an error."""
    ran = cli("list")
    assert ran.code == Exit.OK
    assert "no matching records" in ran.err


# -- show ---------------------------------------------------------------------------------


def test_show_an_unknown_record(cli: Cli, seeded: Seeded, namespace: str) -> None:
    """show: status, why, holder host and pid, the idempotency key, and how to settle it."""
    ran = cli("show", seeded.unknown)
    assert ran.code == Exit.OK
    assert "unknown: may have applied" in ran.out
    assert "builtins.TimeoutError: read timed out" in ran.out
    assert "host seed-host, pid 4242" in ran.out
    assert effectq.idempotency_key(namespace, seeded.unknown) in ran.out
    assert f"effectq resolve '{seeded.unknown}' --applied" in ran.out


def test_show_a_dead_holder(cli: Cli, seeded: Seeded) -> None:
    """A dispatched record whose lease ran out shows as unknown, and says its holder went silent."""
    ran = cli("show", seeded.dead_holder, "--json")
    data = ran.json()
    assert data["standing"] == "unknown"
    assert data["status"] == "dispatched"
    assert data["holder_host"] == "seed-host"
    assert data["holder_pid"] == 4242
    assert data["since"] == data["lease_expires_at"]


def test_show_completed_gives_size_not_body_unless_asked(cli: Cli, seeded: Seeded) -> None:
    """The result body is shown only with --result."""
    plain = cli("show", seeded.completed)
    assert "4 bytes" in plain.out
    assert '"ok"' not in plain.out
    assert '"ok"' in cli("show", seeded.completed, "--result").out
    assert cli("show", seeded.completed, "--result", "--json").json()["result"] == '"ok"'


def test_show_a_missing_key(cli: Cli) -> None:
    """No record: exit 3 and a message, no traceback; --json says it on stdout too."""
    ran = cli("show", "no:such:key")
    assert ran.code == Exit.NOT_FOUND
    assert "no record for key 'no:such:key'" in ran.err
    data = cli("show", "no:such:key", "--json").json()
    assert data["exit"] == Exit.NOT_FOUND
    assert data["key"] == "no:such:key"


# -- resolve ------------------------------------------------------------------------------


@effectq.effect(name="cli.send")
def send(to: str) -> str:
    _sent.append(to)
    if to.startswith("timeout"):
        raise TimeoutError("read timed out")
    return f"sent to {to}"


_sent: list[str] = []


def _unknown_effect(store: effectq.RedisStore, to: str) -> str:
    """Run ``send`` so that it raises a maybe-applied exception; returns its key."""
    with effectq.run("cli-run", store=store), pytest.raises(TimeoutError):
        send(to)
    with effectq.run("cli-run", store=store):
        return send.key(to)


def test_resolve_applied_with_result_replays_it(cli: Cli, redis_store: effectq.RedisStore) -> None:
    """Settled as applied with a result: the next call returns it and does not run."""
    key = _unknown_effect(redis_store, "timeout-a")
    with effectq.run("cli-run", store=redis_store), pytest.raises(effectq.OutcomeUnknown):
        send("timeout-a")
    ran = cli("resolve", key, "--applied", "--result", '"found in the CRM"', "--note", "alice: seen")
    assert ran.code == Exit.OK
    assert "as applied" in ran.out
    _sent.clear()
    with effectq.run("cli-run", store=redis_store):
        assert send("timeout-a") == "found in the CRM"
    assert _sent == []
    record = redis_store.get(key)
    assert record is not None
    assert "alice: seen" in record.error


def test_resolve_applied_without_result(cli: Cli, redis_store: effectq.RedisStore) -> None:
    """Settled as applied without a result: never re-run; a replay says the result was not recorded."""
    key = _unknown_effect(redis_store, "timeout-b")
    assert cli("resolve", key, "--applied").code == Exit.OK
    _sent.clear()
    with effectq.run("cli-run", store=redis_store), pytest.raises(effectq.ResultNotRecordedError):
        send("timeout-b")
    assert _sent == []


def test_resolve_not_applied_lets_the_next_call_apply(cli: Cli, redis_store: effectq.RedisStore) -> None:
    """Settled as not applied: the next call runs the function."""
    key = _unknown_effect(redis_store, "timeout-c")
    data = cli("resolve", key, "--not-applied", "--json").json()
    assert data["resolved"] == "not_applied"
    assert data["before"]["status"] == "unknown"
    assert data["after"]["status"] == "released"
    _sent.clear()
    with effectq.run("cli-run", store=redis_store), pytest.raises(TimeoutError):
        send("timeout-c")
    assert _sent == ["timeout-c"]


def test_resolve_refuses_what_is_not_in_doubt(
    cli: Cli, redis_store: effectq.RedisStore, seeded: Seeded
) -> None:
    """Completed, released and live records are refused (exit 1) and left as they were; missing is exit 3."""
    for key in (seeded.completed, seeded.released, seeded.in_flight):
        before = redis_store.get(key)
        ran = cli("resolve", key, "--not-applied")
        assert ran.code == Exit.FAILED, key
        assert "refused" in ran.err
        after = redis_store.get(key)
        assert after is not None
        assert before is not None
        assert replace(after, expires_at=None) == replace(before, expires_at=None)
    assert "never re-run" in cli("resolve", seeded.completed, "--applied").err
    assert cli("resolve", "no:such:key", "--applied").code == Exit.NOT_FOUND


def test_resolve_settles_a_dead_holder(cli: Cli, redis_store: effectq.RedisStore, seeded: Seeded) -> None:
    """A dispatched record whose holder died is in doubt, so it can be settled."""
    assert cli("resolve", seeded.dead_holder, "--applied", "--result", "1").code == Exit.OK
    record = redis_store.get(seeded.dead_holder)
    assert record is not None
    assert record.result == b"1"


def test_resolve_usage_errors(cli: Cli, seeded: Seeded) -> None:
    """A result that is not JSON, a result with --not-applied, or neither flag: exit 2."""
    assert cli("resolve", seeded.unknown, "--applied", "--result", "{nope").code == Exit.USAGE
    assert cli("resolve", seeded.unknown, "--not-applied", "--result", "1").code == Exit.USAGE
    assert cli("resolve", seeded.unknown).code == Exit.USAGE


def test_resolve_race_has_exactly_one_winner(redis_url: str, namespace: str, seeded: Seeded) -> None:
    """Two operators resolving the same key at once, in two processes: one wins, one is refused."""
    base = [sys.executable, "-m", "effectq", "--url", redis_url, "--namespace", namespace, "resolve"]
    keys = [seeded.unknown, seeded.dead_holder]
    procs = [
        (
            key,
            flag,
            subprocess.Popen([*base, key, flag], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        )
        for key in keys
        for flag in ("--applied", "--not-applied")
    ]
    outcomes: dict[str, list[tuple[int, str]]] = {key: [] for key in keys}
    for key, flag, proc in procs:
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err
        outcomes[key].append((proc.returncode, flag))
    store = effectq.RedisStore.from_url(redis_url, namespace=namespace)
    for key, results in outcomes.items():
        codes = sorted(code for code, _ in results)
        assert codes == [Exit.OK, Exit.FAILED], (key, results)
        winner = next(flag for code, flag in results if code == Exit.OK)
        record = store.get(key)
        assert record is not None
        assert record.status.value == ("completed" if winner == "--applied" else "released")
    store.client.close()


# -- stats and purge ----------------------------------------------------------------------


def test_stats(cli: Cli, seeded: Seeded) -> None:
    """Counts by status and effect, and the age of the oldest unknown."""
    data = cli("stats", "--json").json()
    assert data["counts"] == {"unknown": 2, "in-flight": 2, "completed": 1, "released": 2, "failed": 0}
    assert data["by_effect"]["seed.effect"]["unknown"] == 2
    assert data["oldest_unknown_age_seconds"] > 0
    quick = cli("stats", "--no-scan", "--json").json()
    assert quick["counts"] == {"unknown": 2, "in-flight": 2}
    assert quick["scanned"] is False
    text = cli("stats").out
    assert "OLDEST UNKNOWN" in text
    assert "seed.effect" in text


def test_purge_is_dry_until_yes_and_never_touches_doubt(
    cli: Cli, redis_store: effectq.RedisStore, seeded: Seeded
) -> None:
    """purge --run: a dry run first; with --yes only completed and released records go."""
    dry = cli("purge", "--run", "seed-run")
    assert dry.code == Exit.OK
    assert "would delete 3 records" in dry.out
    assert "add --yes" in dry.err
    assert len(list(redis_store.scan())) == 7
    done = cli("purge", "--run", "seed-run", "--yes", "--json").json()
    assert done["deleted"] == 3
    assert done["kept"] == {"unknown": 2, "in-flight": 2}
    left = {item["key"] for item in cli("list", "--status", "all", "--json").json()}
    assert left == seeded.keys(Standing.UNKNOWN) | seeded.keys(Standing.IN_FLIGHT)


def test_purge_by_age(cli: Cli, seeded: Seeded) -> None:
    """--older-than keeps what changed more recently."""
    assert cli("purge", "--older-than", "1d", "--yes", "--json").json()["deleted"] == 0
    assert cli("purge", "--older-than", "1ms", "--yes", "--json").json()["deleted"] == 3


def test_purge_needs_a_run_or_an_age(cli: Cli) -> None:
    """A purge with no filter is refused, so it never empties a namespace."""
    ran = cli("purge", "--yes")
    assert ran.code == Exit.USAGE
    assert "--run" in ran.err


# -- connection, environment, dispatch ------------------------------------------------------


def test_unreachable_redis(capsys: pytest.CaptureFixture[str]) -> None:
    """A Redis that does not answer: exit 4, one line, no traceback, for every command."""
    url = f"redis://127.0.0.1:{_free_port()}/0"
    for argv in (["list"], ["show", "k"], ["stats"], ["doctor"], ["resolve", "k", "--applied"]):
        assert main([*argv, "--url", url]) == Exit.UNREACHABLE, argv
        err = capsys.readouterr().err
        assert "cannot reach Redis" in err
        assert "Traceback" not in err


def test_bad_url_and_bad_options(capsys: pytest.CaptureFixture[str]) -> None:
    """A URL redis-py cannot parse, an unknown option, a bad duration: exit 2."""
    assert main(["list", "--url", "http://nope"]) == Exit.USAGE
    assert main(["list", "--frobnicate"]) == Exit.USAGE
    assert main(["list", "--older-than", "soon"]) == Exit.USAGE
    assert "not a duration" in capsys.readouterr().err
    assert main(["--help"]) == Exit.OK


def test_password_never_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """A password in --url is masked in every message."""
    url = f"redis://user:s3cr3t@127.0.0.1:{_free_port()}/0"
    main(["stats", "--url", url, "--json"])
    captured = capsys.readouterr()
    assert "s3cr3t" not in captured.out + captured.err
    assert "***" in captured.err


def test_environment_gives_url_and_namespace(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    redis_url: str,
    namespace: str,
    seeded: Seeded,
) -> None:
    """EFFECTQ_URL and EFFECTQ_NAMESPACE stand in for --url and --namespace; options given before win."""
    monkeypatch.setenv("EFFECTQ_URL", redis_url)
    monkeypatch.setenv("EFFECTQ_NAMESPACE", namespace)
    assert main(["list", "--json"]) == Exit.OK
    assert {item["key"] for item in json.loads(capsys.readouterr().out)} == (
        seeded.keys(Standing.UNKNOWN) | seeded.keys(Standing.IN_FLIGHT)
    )
    assert main(["--namespace", "elsewhere", "list", "--json"]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == []


def test_chaos_dispatches_lazily(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """effectq chaos ARGS calls effectq.chaos.main(ARGS); without the module it says so (exit 2)."""
    seen: list[list[str]] = []
    module = types.ModuleType("effectq.chaos")
    module.main = lambda argv: seen.append(argv) or 7  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "effectq.chaos", module)
    assert main(["chaos", "--kill", "3"]) == 7
    assert main(["--url", "redis://x", "chaos", "run"]) == 7
    assert seen == [["--kill", "3"], ["--url", "redis://x", "run"]]
    monkeypatch.setitem(sys.modules, "effectq.chaos", None)
    assert main(["chaos"]) == Exit.USAGE
    assert "effectq.chaos" in capsys.readouterr().err


def test_console_script_runs(redis_url: str) -> None:
    """python -m effectq is the same command (what the console script runs)."""
    ran = subprocess.run(
        [sys.executable, "-m", "effectq", "--url", redis_url, "list", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "EFFECTQ_NAMESPACE": "tcli-empty"},
    )
    assert ran.returncode == 0
    assert json.loads(ran.stdout) == []
