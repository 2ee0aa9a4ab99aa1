"""The checks of one Redis server: each looks at a :class:`Node` and returns a :class:`Finding`.

:data:`CHECKS` lists them in the order ``effectq doctor`` prints them
(:mod:`.doctor` runs them on every node of a deployment). Why each matters:

- eviction: ``maxmemory-policy`` other than ``noeviction`` lets Redis delete
  records to make room. A completed record evicted means its effect applies
  again; an unknown record evicted is forgotten.
- persistence: a restart without AOF loses every record written since the last
  snapshot, and with them the memory that those effects applied.
- replicas: replication is asynchronous; a failover can promote a replica that
  never saw the last claims and completions, unless writes wait for replicas
  (``RedisStore(wait_replicas=N)``: then every primary needs N replicas). On a
  cluster each node is examined, replicas included (they take over on failover).
- scripts: every transition is a Lua script; a server or proxy that refuses
  ``SCRIPT LOAD``/``EVALSHA`` (or an ACL that does) fails every effect, closed.
- clock: leases are judged by the Redis clock; a server clock that jumps makes
  leases run out early (false unknowns), and ages shown to operators wrong.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "CHECKS",
    "Check",
    "Finding",
    "Level",
    "Node",
    "check_clock",
    "check_eviction",
    "check_memory",
    "check_persistence",
    "check_replicas",
    "check_scripts",
    "check_version",
]

CLOCK_SKEW_WARN = 2.0
"""Seconds between this host's clock and Redis' beyond which the clock check warns."""
MEMORY_WARN = 0.9
"""Share of ``maxmemory`` in use beyond which the memory check warns."""
REPLICA_LAG_WARN = 1
"""Seconds of replica lag beyond which the replica check says so."""


class Level(enum.StrEnum):
    """How bad a finding is."""

    OK = "ok"
    WARN = "warn"
    """The guarantee holds, with a window or a cost worth knowing."""
    FAIL = "fail"
    """The guarantee breaks in a case that happens (a restart, a full memory, a failover)."""
    SKIP = "skip"
    """Could not be checked (a command is not allowed); the fix says what to look at instead."""


@dataclass(frozen=True, slots=True)
class Finding:
    """What one check found.

    Attributes:
        check: the check's name (``eviction``, ``persistence``, ...).
        level: how bad.
        summary: what was found, in one line.
        fix: what to do about it (empty when nothing).
        node: the server it concerns (``host:port``), or ``""`` for the namespace.
    """

    check: str
    level: Level
    summary: str
    fix: str = ""
    node: str = ""


class Node:
    """One Redis server; INFO and CONFIG are read once per node.

    Args:
        client: a ``redis.Redis`` connected to this very server.
        name: how to call it in findings (``host:port``).
        wait_replicas: how many replicas the store waits for after a claim and a
            completion (``RedisStore(wait_replicas=N)``); the replicas check holds
            every primary to it.
    """

    def __init__(self, client: Any, name: str, *, wait_replicas: int = 0) -> None:
        self.client = client
        self.name = name
        self.wait_replicas = wait_replicas
        self._info: dict[str, Any] | None = None
        self._config: dict[str, str] | None = None
        self.config_error = ""

    def info(self) -> dict[str, Any]:
        """``INFO`` (every section), parsed by redis-py."""
        if self._info is None:
            self._info = dict(self.client.info("all"))
        return self._info

    def config(self, name: str) -> str | None:
        """A ``CONFIG GET`` value; ``None`` when CONFIG is not allowed (managed Redis, ACL)."""
        if self._config is None:
            try:
                raw = self.client.config_get("*")
            except Exception as exc:
                self.config_error = str(exc)
                self._config = {}
            else:
                self._config = {_text(k): _text(v) for k, v in raw.items()}
        return self._config.get(name)


Check = Callable[[Node], Finding]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


def check_version(node: Node) -> Finding:
    """Redis 5.0 or later: the scripts read ``TIME`` before they write (effect replication)."""
    info = node.info()
    text = str(info.get("redis_version", "?"))
    found = _version(text)
    server = f"Redis {text} ({info.get('redis_mode', 'standalone')})"
    if found and found < (7,) and _clustered(info):
        return Finding(
            "version",
            Level.FAIL,
            f"{server}: on Redis Cluster the scripts publish with SPUBLISH (sharded pub/sub), new in 7.0",
            "upgrade every node to Redis 7.0 or later",
        )
    if found and found < (5,):
        return Finding(
            "version",
            Level.FAIL,
            f"{server}: scripts that read TIME and then write need Redis 5 or later",
            "upgrade to Redis 6.2 or later",
        )
    return Finding("version", Level.OK, server)


def check_eviction(node: Node) -> Finding:
    """``maxmemory-policy`` must be ``noeviction``: an evicted record is a repeated (or forgotten) effect."""
    policy = str(node.info().get("maxmemory_policy") or node.config("maxmemory-policy") or "")
    if not policy:
        return Finding(
            "eviction",
            Level.SKIP,
            "maxmemory-policy not readable",
            "make sure the server's maxmemory-policy is noeviction",
        )
    if policy == "noeviction":
        return Finding("eviction", Level.OK, "maxmemory-policy noeviction: records are never evicted")
    return Finding(
        "eviction",
        Level.FAIL,
        f"maxmemory-policy {policy}: Redis may evict records to make room; an evicted completed record "
        f"means its effect applies again, an evicted unknown one is forgotten",
        "CONFIG SET maxmemory-policy noeviction (and set it in redis.conf or your provider's parameter "
        "group); keep caches on another Redis",
    )


def check_memory(node: Node) -> Finding:
    """Headroom under ``maxmemory``: when it is full, writes fail and effects fail closed (not run)."""
    info = node.info()
    limit = int(info.get("maxmemory") or 0)
    used = int(info.get("used_memory") or 0)
    if not limit:
        return Finding("memory", Level.OK, f"no maxmemory set; {used / 2**20:.0f} MiB used")
    share = used / limit
    summary = f"{used / 2**20:.0f} MiB of {limit / 2**20:.0f} MiB maxmemory used ({share:.0%})"
    if share >= MEMORY_WARN:
        return Finding(
            "memory",
            Level.WARN,
            f"{summary}: when full, claims fail and effects do not run",
            "raise maxmemory, shorten retention, or effectq purge --older-than",
        )
    return Finding("memory", Level.OK, summary)


def check_persistence(node: Node) -> Finding:
    """AOF with ``appendfsync always`` (or ``everysec``, with its one-second window)."""
    info = node.info()
    if (
        str(info.get("aof_last_write_status", "ok")) != "ok"
        or str(info.get("rdb_last_bgsave_status", "ok")) != "ok"
    ):
        return Finding(
            "persistence",
            Level.FAIL,
            "the last persistence write failed (disk full? permissions?)",
            "check the Redis log; until it is fixed a restart loses records",
        )
    aof = bool(int(info.get("aof_enabled") or 0))
    fsync = node.config("appendfsync")
    save = node.config("save")
    if not aof:
        if save:
            what = (
                f"RDB snapshots only (save {save!r}): a restart loses the records written since the last one"
            )
        else:
            what = "no persistence at all: a restart loses every record"
        return Finding(
            "persistence",
            Level.FAIL,
            f"appendonly no, {what}; effects whose record is lost apply again on their next call",
            "CONFIG SET appendonly yes; CONFIG SET appendfsync always (or everysec); then CONFIG REWRITE",
        )
    if fsync is None:
        return Finding(
            "persistence",
            Level.WARN,
            "appendonly yes; appendfsync not readable (CONFIG not allowed)",
            "check that appendfsync is always or everysec",
        )
    if fsync == "always":
        return Finding("persistence", Level.OK, "appendonly yes, appendfsync always: every write is on disk")
    if fsync == "everysec":
        return Finding(
            "persistence",
            Level.WARN,
            "appendonly yes, appendfsync everysec: a machine crash (not a Redis crash) can lose the last "
            "second of records",
            "appendfsync always closes that window, at a latency cost; or accept it",
        )
    return Finding(
        "persistence",
        Level.WARN,
        f"appendonly yes, appendfsync {fsync}: the OS decides when to "
        f"write; a machine crash can lose tens of seconds of records",
        "CONFIG SET appendfsync always (or everysec)",
    )


def check_replicas(node: Node) -> Finding:
    """Replication is asynchronous: a failover can lose the last writes unless writes wait for replicas.

    On a cluster every node is examined: a replica is expected (it takes over its
    primary's slots), and its link is what matters.
    """
    info = node.info()
    role = str(info.get("role", "master"))
    if role != "master":
        upstream = f"{info.get('master_host')}:{info.get('master_port')}"
        if not _clustered(info):
            return Finding(
                "replicas",
                Level.FAIL,
                f"this server is a replica (of {upstream}): it refuses writes, so every effect fails",
                "point effectq at the primary (or at Sentinel / the cluster)",
            )
        link = str(info.get("master_link_status", "?"))
        if link != "up":
            return Finding(
                "replicas",
                Level.WARN,
                f"cluster replica of {upstream}, link {link}: promoted now, it would lack its primary's "
                f"latest claims and completions",
                "look at the replication link in both nodes' logs",
            )
        return Finding("replicas", Level.OK, f"cluster replica of {upstream}, link up")
    count = int(info.get("connected_slaves") or 0)
    lags = [
        int(value.get("lag", 0))
        for name, value in info.items()
        if name.startswith("slave") and name[5:].isdigit() and isinstance(value, dict)
    ]
    lag = f", max lag {max(lags)}s" if lags and max(lags) >= REPLICA_LAG_WARN else ""
    minimum = node.config("min-replicas-to-write") or "?"
    wait = node.wait_replicas
    if wait and count < wait:
        return Finding(
            "replicas",
            Level.FAIL,
            f"{count} replica(s) connected, min-replicas-to-write {minimum}, but the store waits for "
            f"{wait}: every claim that must run is refused (ClaimNotReplicatedError), nothing runs",
            f"give this primary {wait} replica(s), or lower wait_replicas",
        )
    if wait:
        return Finding(
            "replicas",
            Level.OK,
            f"{count} replica(s){lag}, min-replicas-to-write {minimum}; the store waits for {wait} after "
            f"each claim and completion, so a failover leaves at worst an unknown, never a repeat",
        )
    if not count:
        return Finding("replicas", Level.OK, "no replicas: no failover to lose writes in")
    return Finding(
        "replicas",
        Level.WARN,
        f"{count} replica(s){lag}, min-replicas-to-write {minimum}: replication is asynchronous, so a "
        f"failover can promote a replica that missed the last claims or completions, and those effects "
        f"can apply again",
        "make the store WAIT for replicas after each claim and completion (see docs/deployment.md), and "
        "set min-replicas-to-write; the remote API's idempotency key is the last line of defence",
    )


def _clustered(info: dict[str, Any]) -> bool:
    return bool(int(info.get("cluster_enabled") or 0))


def check_scripts(node: Node) -> Finding:
    """Every script loads (``SCRIPT LOAD``), as redis-py does when ``EVALSHA`` says NOSCRIPT."""
    from ..store.redis import _SCRIPTS, _lua

    for name in _SCRIPTS:
        source = _lua(name)
        try:
            sha = _text(node.client.script_load(source))
        except Exception as exc:
            return Finding(
                "scripts",
                Level.FAIL,
                f"{name}.lua does not load: {exc}",
                "allow SCRIPT LOAD, EVALSHA and EVAL for effectq's user (ACL +@scripting), and "
                "do not put a proxy that blocks Lua in between",
            )
        if sha != hashlib.sha1(source.encode()).hexdigest():  # noqa: S324 - Redis names scripts by SHA-1
            return Finding(
                "scripts",
                Level.FAIL,
                f"{name}.lua loaded under an unexpected SHA ({sha})",
                "is this a Redis-compatible server that implements Lua differently?",
            )
    return Finding("scripts", Level.OK, f"all {len(_SCRIPTS)} scripts load")


def check_clock(node: Node) -> Finding:
    """The Redis clock is close to this host's: leases are judged by it, ages are shown by it."""
    before = time.time()
    seconds, micros = node.client.time()
    after = time.time()
    server = seconds + micros / 1e6
    skew = server - (before + after) / 2
    when = datetime.fromtimestamp(server, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    if server < 1_577_836_800:  # 2020-01-01
        return Finding("clock", Level.FAIL, f"server clock says {when}", "set the server's clock (NTP)")
    if abs(skew) > CLOCK_SKEW_WARN:
        return Finding(
            "clock",
            Level.WARN,
            f"server clock {when} is {skew:+.1f}s from this host's: leases are judged by the server alone, "
            f"so this is safe, but a server clock that steps makes leases run out early (false unknowns)",
            "run NTP (chrony) on the Redis host and on this one",
        )
    return Finding("clock", Level.OK, f"server clock {when}, {skew:+.3f}s from this host's")


CHECKS: tuple[Check, ...] = (
    check_version,
    check_eviction,
    check_memory,
    check_persistence,
    check_replicas,
    check_scripts,
    check_clock,
)
"""The checks run on every node, in order."""
