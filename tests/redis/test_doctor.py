"""effectq doctor against real redis-server processes configured right and wrong.

Each test starts its own servers on free loopback ports (in a temporary
directory) and stops them; the shared Redis is only read, never reconfigured.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import effectq
from effectq.cli import Exit, main
from effectq.doctor import Finding, Level, Node, check_clock, diagnose
from effectq.testing import seed_records
from tests.support.servers import Server as RedisServer
from tests.support.servers import stop_all, wait_until

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")

Start = Callable[..., str]
"""Starts a redis-server with extra arguments; returns its URL."""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Start]:
    """Start ``redis-server`` with extra arguments on a free port; returns its URL. Stopped afterwards."""
    started: list[RedisServer] = []

    def start(*args: str) -> str:
        started.append(RedisServer(tmp_path, *args).start())
        return f"redis://{started[-1].address}/0"

    yield start
    stop_all(started)


def _doctor(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Finding]]:
    code = main(["doctor", "--url", url, "--json", *extra])
    data = json.loads(capsys.readouterr().out)
    findings = {f["check"]: Finding(**{**f, "level": Level(f["level"])}) for f in data["findings"]}
    return code, findings


def test_a_safe_server_passes(server: Start, capsys: pytest.CaptureFixture[str]) -> None:
    """noeviction, AOF with fsync always, no replicas: nothing fails, exit 0."""
    url = server("--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction")
    code, found = _doctor(url, capsys)
    assert code == Exit.OK
    assert {name: f.level for name, f in found.items()} == {
        "version": Level.OK,
        "eviction": Level.OK,
        "memory": Level.OK,
        "persistence": Level.OK,
        "replicas": Level.OK,
        "scripts": Level.OK,
        "clock": Level.OK,
        "in doubt": Level.OK,
    }


def test_eviction_and_no_persistence_fail_with_fixes(
    server: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    """allkeys-lru and no AOF: both fail, each with its fix; exit 1; the table says so too."""
    url = server("--maxmemory-policy", "allkeys-lru", "--maxmemory", "64mb")
    code, found = _doctor(url, capsys)
    assert code == Exit.FAILED
    assert found["eviction"].level is Level.FAIL
    assert "allkeys-lru" in found["eviction"].summary
    assert "noeviction" in found["eviction"].fix
    assert found["persistence"].level is Level.FAIL
    assert "appendonly yes" in found["persistence"].fix
    assert main(["doctor", "--url", url]) == Exit.FAILED
    text = capsys.readouterr().out
    assert "FAIL  eviction" in text
    assert "fix: CONFIG SET maxmemory-policy noeviction" in text


def test_everysec_is_a_warning(server: Start, capsys: pytest.CaptureFixture[str]) -> None:
    """AOF with fsync everysec holds except for a machine crash: a warning, exit 0."""
    url = server("--appendonly", "yes", "--appendfsync", "everysec")
    code, found = _doctor(url, capsys)
    assert code == Exit.OK
    assert found["persistence"].level is Level.WARN
    assert "last second" in found["persistence"].summary


def test_replicas_are_reported_and_a_replica_refused(
    server: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    """A primary with a replica warns about failover; pointing doctor at the replica fails."""
    primary = server("--appendonly", "yes", "--appendfsync", "always")
    port = primary.rsplit(":", 1)[1].split("/")[0]
    replica = server("--replicaof", "127.0.0.1", port)
    client = redis.Redis.from_url(primary)
    wait_until(lambda: int(client.info("replication")["connected_slaves"]) == 1, "the replica to connect")
    client.close()
    code, found = _doctor(primary, capsys)
    assert code == Exit.OK
    assert found["replicas"].level is Level.WARN
    assert "1 replica" in found["replicas"].summary
    assert "WAIT" in found["replicas"].fix
    code, found = _doctor(replica, capsys)
    assert code == Exit.FAILED
    assert found["replicas"].level is Level.FAIL
    assert "primary" in found["replicas"].fix


def test_a_user_without_scripting_fails_the_scripts_check(
    server: Start, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ACL that forbids Lua (and CONFIG) fails the scripts check; the password is never printed."""
    url = server()
    admin = redis.Redis.from_url(url)
    admin.execute_command(
        "ACL", "SETUSER", "ops", "on", ">hunter2x", "~*", "&*", "+@all", "-@scripting", "-config"
    )
    admin.close()
    limited = url.replace("redis://", "redis://ops:hunter2x@")
    code = main(["doctor", "--url", limited, "--json"])
    out = capsys.readouterr()
    assert "hunter2x" not in out.out + out.err
    findings = {f["check"]: f for f in json.loads(out.out)["findings"]}
    assert code == Exit.FAILED
    assert findings["scripts"]["level"] == "fail"
    assert "+@scripting" in findings["scripts"]["fix"]
    assert findings["eviction"]["level"] == "ok", "read from INFO when CONFIG is not allowed"


def test_records_in_doubt_are_reported(redis_store: effectq.RedisStore) -> None:
    """Doctor counts what is in doubt in the namespace and says how to settle it."""
    seed_records(redis_store)
    found = {f.check: f for f in diagnose(redis_store)}
    assert found["in doubt"].level is Level.WARN
    assert "2 record(s) in doubt" in found["in doubt"].summary
    assert "effectq list" in found["in doubt"].fix


class _SkewedClient:
    """A Redis whose TIME is an hour ahead (the only way to show a skewed clock without root)."""

    def __init__(self, real: redis.Redis) -> None:
        self._real = real

    def time(self) -> Any:
        seconds, micros = self._real.time()
        return seconds + 3600, micros


def test_clock_skew_warns(redis_client: redis.Redis) -> None:
    """A server clock an hour off this host's is a warning naming NTP."""
    found = check_clock(Node(_SkewedClient(redis_client), "skewed"))
    assert found.level is Level.WARN
    assert "+3600" in found.summary
    assert "NTP" in found.fix
    assert check_clock(Node(redis_client, "real")).level is Level.OK
