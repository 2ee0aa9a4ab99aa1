"""A ledger that plays the remote system: it records every application of an effect.

Workers apply effects to it; tests and the chaos runner read it afterwards, so
"applied exactly once" is judged by an external record, never by effectq's own.
It lives on a Redis server (one hash-tagged key family per ledger name) that is
not the store's, so restarting the store's Redis never loses the evidence.

Like a remote API that honours fencing tokens, it keeps a fence per idempotency
key: a lookup (a reconcile hook asking "did this apply?") raises the fence to the
asker's token, and an application with a token below the fence is refused. So a
worker that was paused past its lease and resumes cannot apply after its
successor looked. Token 0 means "no fencing" (effectq switched off).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Application", "Fenced", "Ledger"]

_APPLY = """
-- KEYS[1] applications list, KEYS[2] applied hash (idempotency key -> value), KEYS[3] fence hash
-- ARGV[1] idempotency key, ARGV[2] token, ARGV[3] entry (JSON), ARGV[4] value
-- Reply: {1, value} applied; {0, fence} refused: a token at or above ARGV[2] looked first.
local token = tonumber(ARGV[2])
if token > 0 then
  local fence = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
  if fence > token then
    return {0, tostring(fence)}
  end
  redis.call('HSET', KEYS[3], ARGV[1], token)
end
redis.call('RPUSH', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
return {1, ARGV[4]}
"""

_LOOKUP = """
-- KEYS[1] applied hash, KEYS[2] fence hash
-- ARGV[1] idempotency key, ARGV[2] token of the asker
-- Reply: the recorded value, or false. Raises the fence to ARGV[2].
local token = tonumber(ARGV[2])
if token > 0 then
  local fence = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0')
  if token > fence then
    redis.call('HSET', KEYS[2], ARGV[1], token)
  end
end
return redis.call('HGET', KEYS[1], ARGV[1])
"""


class Fenced(Exception):
    """The ledger refused an application: a later holder of the effect already looked.

    Attributes:
        identity: the effect's identity.
        fence: the token that looked.
    """

    def __init__(self, identity: str, fence: int) -> None:
        self.identity = identity
        self.fence = fence
        super().__init__(f"the ledger refused {identity}: fenced by token {fence}")


@dataclass(frozen=True, slots=True)
class Application:
    """One application the ledger recorded.

    Attributes:
        identity: what was applied (the same for every attempt at one effect).
        idempotency_key: the key the caller gave (``""`` without effectq).
        token: the fencing token the caller held (0 without effectq).
        pid: the process that applied it.
        at: when (the applier's clock, seconds).
    """

    identity: str
    idempotency_key: str
    token: int
    pid: int
    at: float


class Ledger:
    """An external record of applications, on Redis.

    Args:
        client: a ``redis.Redis`` client of a server the test does not restart.
        name: the ledger's name; its keys are ``effectq-ledger:{name}:*``.
    """

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name
        base = f"effectq-ledger:{{{name}}}"
        self._applications = f"{base}:applications"
        self._applied = f"{base}:applied"
        self._fence = f"{base}:fence"
        self._events = f"{base}:events"
        self._armed = f"{base}:armed"
        self._apply = client.register_script(_APPLY)
        self._lookup = client.register_script(_LOOKUP)

    @classmethod
    def from_url(cls, url: str, name: str) -> Ledger:
        """A ledger on the Redis server at ``url``."""
        import redis

        return cls(redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10), name)

    # -- the remote system's API -------------------------------------------------------------

    def apply(self, identity: str, *, idempotency_key: str = "", token: int = 0, value: str = "") -> str:
        """Apply an effect: record it and return its value. Raises :class:`Fenced` when refused."""
        entry = json.dumps(
            {
                "identity": identity,
                "key": idempotency_key,
                "token": token,
                "pid": os.getpid(),
                "at": time.time(),
            }
        )
        key = idempotency_key or identity
        ok, reply = self._apply(
            keys=[self._applications, self._applied, self._fence],
            args=[key, token, entry, value or identity],
        )
        if not int(ok):
            raise Fenced(identity, int(reply))
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def lookup(self, idempotency_key: str, *, token: int = 0) -> str | None:
        """The value an application with this idempotency key recorded, or ``None`` (raises the fence)."""
        found = self._lookup(keys=[self._applied, self._fence], args=[idempotency_key, token])
        if found is None:
            return None
        return found.decode() if isinstance(found, bytes) else str(found)

    # -- events: what tests and the chaos runner count besides applications ------------------

    def note(self, kind: str, **fields: Any) -> None:
        """Record an event (a task started, finished, gave up...)."""
        self.client.rpush(
            self._events, json.dumps({"kind": kind, "pid": os.getpid(), "at": time.time(), **fields})
        )

    def events_since(self, index: int) -> tuple[list[dict[str, Any]], int]:
        """Events recorded from position ``index`` on, and the position after them (for polling)."""
        found = [json.loads(raw) for raw in self.client.lrange(self._events, index, -1)]
        return found, index + len(found)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every event recorded, oldest first (only ``kind`` when given)."""
        found = [json.loads(raw) for raw in self.client.lrange(self._events, 0, -1)]
        return [e for e in found if kind is None or e["kind"] == kind]

    def arm(self, tag: str) -> bool:
        """True the first time ``tag`` is armed in this ledger, False after (a one-shot trigger)."""
        return bool(self.client.hset(self._armed, tag, 1))

    # -- reading the evidence ----------------------------------------------------------------

    def applications(self) -> list[Application]:
        """Every application, oldest first."""
        return [
            Application(d["identity"], d["key"], int(d["token"]), int(d["pid"]), float(d["at"]))
            for d in (json.loads(raw) for raw in self.client.lrange(self._applications, 0, -1))
        ]

    def counts(self) -> Counter[str]:
        """How many times each identity was applied."""
        return Counter(a.identity for a in self.applications())

    def clear(self) -> None:
        """Delete the ledger's keys."""
        self.client.delete(self._applications, self._applied, self._fence, self._events, self._armed)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether every expected effect applied exactly once.

    Attributes:
        expected: how many effects should have applied.
        applications: how many applications the ledger holds.
        duplicates: identity -> how many times it applied, for those applied more than once.
        missing: identities that never applied.
        unexpected: identities applied that nobody expected.
    """

    expected: int
    applications: int
    duplicates: Mapping[str, int] = field(default_factory=dict)
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No duplicate, nothing missing, nothing unexpected."""
        return not (self.duplicates or self.missing or self.unexpected)

    @property
    def extra(self) -> int:
        """Applications beyond the first of each identity (the harm duplicates did)."""
        return sum(count - 1 for count in self.duplicates.values())

    def __str__(self) -> str:
        if self.ok:
            return f"{self.expected} effects, each applied exactly once"
        parts = []
        if self.duplicates:
            shown = ", ".join(f"{k} x{v}" for k, v in sorted(self.duplicates.items())[:10])
            parts.append(f"{len(self.duplicates)} applied more than once ({shown})")
        if self.missing:
            parts.append(f"{len(self.missing)} never applied ({', '.join(self.missing[:10])})")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} unexpected ({', '.join(self.unexpected[:10])})")
        return f"of {self.expected} effects: " + "; ".join(parts)


def verdict(counts: Ledger | Mapping[str, int], expected: Iterable[str]) -> Verdict:
    """Judge applications (a ledger, or identity -> count) against the identities expected once each."""
    found = counts.counts() if isinstance(counts, Ledger) else Counter(counts)
    wanted = list(dict.fromkeys(expected))
    wanted_set = set(wanted)
    return Verdict(
        expected=len(wanted),
        applications=sum(found.values()),
        duplicates={k: v for k, v in found.items() if v > 1},
        missing=tuple(k for k in wanted if found.get(k, 0) == 0),
        unexpected=tuple(sorted(k for k in found if k not in wanted_set)),
    )


def assert_exactly_once(counts: Ledger | Mapping[str, int], expected: Iterable[str]) -> Verdict:
    """Fail (AssertionError) unless every expected identity applied exactly once; returns the verdict."""
    result = verdict(counts, expected)
    if not result.ok:
        raise AssertionError(f"not exactly once: {result}")
    return result
