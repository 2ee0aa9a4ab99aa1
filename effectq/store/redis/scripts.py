"""The Lua scripts of :class:`~effectq.store.redis.RedisStore` and how they reach Redis.

Their names, their sources in ``lua/`` (one file per operation, each opening with its
contract), which may run twice, and the synchronous sending: on the pipelined lane where the
client has one (:mod:`.wire`), else through redis-py's ``Script``; with ``WAIT`` pipelined
behind it when replicas must acknowledge the write. The async half is :mod:`.aio_store`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING, Any

from ... import events
from ...errors import StoreError
from .errors import raise_failure
from .replicas import run_and_wait
from .traced import Peer, run_traced
from .wire.sync import Lane

if TYPE_CHECKING:
    import redis as _redis

__all__ = ["RETRY_SAFE", "SCRIPTS", "ScriptCalls", "lua"]

SCRIPTS = (
    "claim",
    "complete",
    "release",
    "mark_unknown",
    "fail",
    "dispatch",
    "renew",
    "resolve",
    "read",
    "purge",
)
RETRY_SAFE = frozenset({"claim", "complete", "fail", "dispatch", "renew", "resolve", "read"})
"""Scripts that may run twice: a retried claim of the same owner gets its grant back, a
completion, failure, dispatch or renewal of the same token is idempotent, a resolve finding the record
settled as it asks reports it settled, a read writes nothing."""


def lua(name: str) -> str:
    """The source of one script."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


class ScriptCalls:
    """Running a script by name, for :class:`~effectq.store.redis.RedisStore` to inherit."""

    _client: _redis.Redis | _redis.RedisCluster
    _sharded: bool
    _lane: Lane | None
    _peer: Peer | None
    _sources: dict[str, str]
    _scripts: dict[str, Any]
    _wait_replicas: int
    _replica_timeout_ms: int

    def _run(self, name: str, key: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self._scripts[name]
        lane = self._lane
        try:
            if lane is not None:
                send = lane.evalsha
                if events._tracers:  # APM cannot see the wire (see traced.py): a span of effectq's own
                    send = functools.partial(run_traced, name, self._peer, send)
                return send(script.sha, self._sources[name], keys, args, retry=name in RETRY_SAFE)
            return script(keys=keys, args=args)
        except Exception as exc:
            raise_failure(name, key, exc)

    def _run_replicated(self, name: str, key: str, keys: Sequence[str], args: list[Any]) -> tuple[Any, int]:
        """A script whose write a failover must not lose: (reply, replicas that acknowledged).

        Without ``wait_replicas`` it is a plain call and reports 0 acknowledgements, all it asked for.
        """
        if not self._wait_replicas:
            return self._run(name, key, keys, args), 0
        try:
            lane = self._lane
            if lane is not None:
                send = lane.evalsha_wait
                if events._tracers:  # as in _run
                    send = functools.partial(run_traced, name, self._peer, send)
                return send(
                    self._scripts[name].sha,
                    self._sources[name],
                    keys,
                    args,
                    replicas=self._wait_replicas,
                    timeout_ms=self._replica_timeout_ms,
                    retry=name in RETRY_SAFE,
                )
            return run_and_wait(
                self._client,
                self._scripts[name],
                keys,
                args,
                replicas=self._wait_replicas,
                timeout_ms=self._replica_timeout_ms,
                cluster=self._sharded,
            )
        except StoreError:
            raise
        except Exception as exc:
            raise_failure(name, key, exc)

    def _short(self, acknowledged: int) -> bool:
        return acknowledged < self._wait_replicas
