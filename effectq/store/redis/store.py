"""The Redis store: every transition is one Lua script, judged by Redis' clock.

The keys are :mod:`.layout`'s. The scripts live in ``lua/`` (one file per operation, each opening with its
contract) and are registered per store instance; redis-py's ``Script`` reloads
them after a ``SCRIPT FLUSH`` or a failover. Because every script touches one
slot, the same scripts run on Redis Cluster (``redis.cluster.RedisCluster``),
which routes each call to its slot's primary and follows ``MOVED``/``ASK``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ... import events
from ..._runtime.leases import heartbeat
from ...errors import (
    ClaimNotReplicatedError,
    CompletionNotReplicatedError,
    ConfigurationError,
    CorruptRecordError,
    InvalidKeyError,
    ResolveRefusedError,
    StoreError,
)
from ...keys import check_namespace
from ...options import Duration, seconds
from ..base import Claim, ClaimKind, ClaimRequest, Record, ResultState, Status, Store, Unsubscribe
from .admin import RedisOperations
from .aio_store import AsyncScripts, OnTheLoop
from .cluster import check_cluster, is_cluster
from .connect import client_from_url, protect_client
from .errors import failure
from .layout import KeyLayout, Layout
from .notify import Notifier
from .reads import RecordReads
from .replies import STATUS, decode_claim, text
from .scripts import SCRIPTS, ScriptCalls, lua
from .sentinel import sentinel_lane_for
from .traced import peer_of, post_traced
from .wire import sync
from .wire.aio import async_lane_for
from .wire.sync import lane_for

if TYPE_CHECKING:
    import redis as _redis

__all__ = ["RedisStore"]

log = logging.getLogger("effectq.store")

MAX_POLL = 0.01
"""The longest ``poll_replies`` takes: a reply that takes longer is not worth a core's polling."""
_STORED = ResultState.STORED  # read on every completion: a global, not an Enum class's attribute


class RedisStore(KeyLayout, ScriptCalls, AsyncScripts, RecordReads, RedisOperations, Store):
    """A store on Redis (or fakeredis with lupa, which runs the same Lua).

    Besides the store primitives it has the operator ones (listing, summary,
    purge: :class:`~effectq.store.operators.OperatorStore`), in :mod:`.admin`.

    Args:
        client: a ready ``redis.Redis`` (or compatible) client, or a
            ``redis.cluster.RedisCluster`` (Redis 7.0+).
        namespace: isolates tenants; one namespace never sees another's records.
        prefix: first segment of every Redis key.
        wait_replicas: after a claim that runs the function, and after a
            completion, wait until this many replicas acknowledged the write
            (``WAIT``, pipelined with the script: no extra round trip). Fewer
            within ``replica_timeout`` raises
            :class:`~effectq.errors.ClaimNotReplicatedError` (the function does
            not run) or :class:`~effectq.errors.CompletionNotReplicatedError`
            (it ran; its record may be lost on failover). 0, the default, waits
            for nothing. See ``docs/deployment.md``.
        replica_timeout: how long to wait for the replicas (below the socket timeout).
        via_execute_command: send the scripts through redis-py's ``Redis.execute_command``,
            which APM's Redis instrumentation wraps, rather than effectq's own wire, which it
            cannot see; slower (no pipelined completions): see ``docs/operations.md``.
        poll_replies: wait for each reply of the synchronous wire by polling its socket for up
            to this long (seconds or a timedelta; at most 0.01) before sleeping in the read. On
            a virtual machine whose idle CPU is slow to wake, a round trip then costs a fraction
            of what it does asleep; the waiting thread spends its CPU for as long as it polls.
            Worth it where each worker has a core (solo, or prefork with a process per core);
            not under gevent or eventlet, whose sockets are never polled. 0, the default,
            sleeps at once; refused where the scripts go through redis-py's commands
            (``via_execute_command``, Cluster). See ``docs/operations.md``.

    Example:
        >>> store = RedisStore.from_url("redis://127.0.0.1:6379/0", namespace="shop")
        >>> store = RedisStore.from_url("redis+cluster://10.0.0.1:6379,10.0.0.2:6379", namespace="shop")
        >>> store = RedisStore.from_url("redis://primary:6379/0", wait_replicas=1, replica_timeout=0.5)
    """

    def __init__(
        self,
        client: _redis.Redis | _redis.RedisCluster,
        *,
        namespace: str = "default",
        prefix: str = "effectq",
        wait_replicas: int = 0,
        replica_timeout: Duration = 1.0,
        via_execute_command: bool = False,
        poll_replies: Duration = 0,
    ) -> None:
        poll = seconds(poll_replies, option="poll_replies", allow_zero=True)
        if poll > MAX_POLL:
            raise ConfigurationError(
                f"poll_replies is how long to wait for one reply by polling, at most {MAX_POLL:g} s "
                f"(a few hundred microseconds is typical), not {poll_replies!r}"
            )
        if type(via_execute_command) is not bool:
            raise ConfigurationError(
                f"via_execute_command must be True or False, not {via_execute_command!r}"
            )
        options: dict[str, Any] = getattr(client, "get_connection_kwargs", dict)()
        if options.get("decode_responses"):
            raise ConfigurationError(
                "RedisStore needs a client with decode_responses=False: records and results are bytes"
            )
        protect_client(client)
        self._client = client
        self._wait_replicas = _replica_count(wait_replicas)
        self._replica_timeout_ms = max(1, round(seconds(replica_timeout, option="replica_timeout") * 1000))
        self._sharded = is_cluster(client)
        self._init_layout(check_namespace(namespace), check_namespace(prefix), sharded=self._sharded)
        if self._sharded:
            check_cluster(client)
        self._publish = "s" if self._sharded else ""
        self._sources = {name: lua(name) for name in SCRIPTS}
        self._scripts = {name: client.register_script(source) for name, source in self._sources.items()}
        self._lane = (
            None
            if via_execute_command
            else lane_for(client, poll=poll) or sentinel_lane_for(client, poll=poll)
        )
        if poll and self._lane is None:
            raise ConfigurationError(
                "poll_replies needs effectq's own wire, and this store's scripts go through "
                "redis-py's commands (via_execute_command=True, a Cluster client or a client of "
                "another kind), which do not poll: leave poll_replies out"
            )
        self._async_lane = None if self._wait_replicas else async_lane_for(client, self._lane)
        self._peer = peer_of(client)
        self._on_loop = None
        if self._async_lane is not None:  # a subclass's own claim or complete keeps its thread
            own_claim = type(self).claim is RedisStore.claim
            own_complete = type(self).complete is RedisStore.complete
            if own_claim or own_complete:
                own_prefetch = type(self).prefetch is RedisStore.prefetch
                self._on_loop = OnTheLoop(self, own_claim, own_complete, own_prefetch)
        self._notifier = Notifier(client, self.channels(), sharded=self._sharded)
        weakref.finalize(self, _hand_back, self._lane, self._notifier).atexit = False

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        namespace: str = "default",
        prefix: str = "effectq",
        wait_replicas: int = 0,
        replica_timeout: Duration = 1.0,
        via_execute_command: bool = False,
        poll_replies: Duration = 0,
        **kwargs: Any,
    ) -> RedisStore:
        """Build a store from a ``redis://``, ``rediss://`` or ``unix://`` URL, or a cluster or
        Sentinel URL.

        ``redis+cluster://[user:password@]host:port[,host:port...][?option=value]``
        (``rediss+cluster://`` for TLS) connects to Redis Cluster: the hosts are
        seed nodes, the client finds the others.
        ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db][?option=value]``
        (``rediss+sentinel://`` for TLS) connects to the primary the sentinels at the
        hosts name for ``service``, and follows a failover; ``sentinel_password``
        (a query option or keyword) is the sentinels' own (see
        :mod:`effectq.store.sentinel`). Socket timeouts default to 5
        seconds, so a Redis that stops answering becomes a
        :class:`~effectq.errors.StoreError` instead of a hang (the sentinels get
        them too). Other keyword arguments go to ``redis.Redis.from_url`` (or
        ``redis.cluster.RedisCluster``, or the Sentinel primary's connections).
        """
        client = client_from_url(url, wait_replicas=wait_replicas, replica_timeout=replica_timeout, **kwargs)
        return cls(
            client,
            namespace=namespace,
            prefix=prefix,
            wait_replicas=wait_replicas,
            replica_timeout=replica_timeout,
            via_execute_command=via_execute_command,
            poll_replies=poll_replies,
        )

    @classmethod
    def embedded(cls, *, namespace: str = "default", server: Any = None) -> RedisStore:
        """A store on an in-process fakeredis server that runs the real Lua scripts.

        Needs ``pip install 'effectq[embedded]'`` (fakeredis with lupa). Records live
        as long as ``server`` (a ``fakeredis.FakeServer``; a new one by default).
        """
        try:
            import fakeredis
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "the embedded store needs fakeredis with Lua: pip install 'effectq[embedded]'"
            ) from exc
        client = fakeredis.FakeRedis(server=server or fakeredis.FakeServer())
        return cls(client, namespace=namespace)

    def __repr__(self) -> str:
        return f"RedisStore({self._client!r}, namespace={self._namespace!r})"

    @property
    def namespace(self) -> str:
        return self._namespace

    @property
    def client(self) -> _redis.Redis | _redis.RedisCluster:
        """The redis client this store talks through."""
        return self._client

    @property
    def clustered(self) -> bool:
        """Whether the client is a Redis Cluster client."""
        return self._sharded

    @property
    def wait_replicas(self) -> int:
        """How many replicas must acknowledge a claim and a completion (0: none)."""
        return self._wait_replicas

    # -- primitives ---------------------------------------------------------------------

    def claim(self, key: str, request: ClaimRequest) -> Claim:
        layout, args = self._claim_args(key, request)
        if not self._wait_replicas:
            return decode_claim(key, self._run("claim", key, layout.script_keys, args))
        reply, acknowledged = self._run_replicated("claim", key, layout.script_keys, args)
        claim = decode_claim(key, reply)
        if claim.kind is ClaimKind.CLAIMED and self._short(acknowledged):
            raise ClaimNotReplicatedError(
                key, claim=claim, acknowledged=acknowledged, required=self._wait_replicas
            )
        return claim

    flush_pending = staticmethod(sync.flush_pending)
    """Read the replies this thread's pipelined completions still have pending (a run's end): the
    wire's own function, no call around it."""

    def _settled(self, key: str, settle: Callable[[bool | StoreError], None]) -> Callable[[Any], None]:
        """A posted completion's reply (or the exception that stopped it being read) as
        :meth:`complete` would have returned or raised it, handed to ``settle``."""

        def settled(reply: Any) -> None:
            if isinstance(reply, BaseException):
                error = failure("complete", key, reply)
                error.__cause__ = reply  # a cancelled read is no failure of Redis: the caller tells
                settle(error)
            else:
                settle(bool(reply))

        return settled

    def _claim_args(self, key: str, request: ClaimRequest) -> tuple[Layout, list[Any]]:
        """claim.lua's layout and arguments, for either path."""
        flags = (
            ("r" if request.can_reconcile else "")
            + ("s" if request.replay_safe else "")
            + ("f" if request.reconcile_first else "")
            + ("i" if request.prefetch else "")
        )
        identity = f"{request.name}\n{request.run_id}\n{key}\n{request.input_hash}"  # h, ready to write
        if identity.count("\n") != 3:  # a part with a line break (effects check their parts;
            # a direct caller may not have)
            raise InvalidKeyError(
                f"a name, run id or key with a line break cannot be claimed ({identity!r}); "
                "nothing was written"
            )
        layout = self._layout_of(key)
        args = [request.lease_ms, request.owner, flags, identity, request.retention_ms, request.max_attempts]
        return layout, args

    def complete(
        self,
        key: str,
        token: int,
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool:
        keys, args = self._complete_args(key, token, result, result_state, retention_ms)
        reply, acknowledged = self._run_replicated("complete", key, keys, args)
        if reply and self._short(acknowledged):
            raise CompletionNotReplicatedError(key, acknowledged=acknowledged, required=self._wait_replicas)
        return bool(reply)

    def complete_pipelined(
        self,
        key: str,
        token: int,
        on_reply: Callable[[bool | StoreError], None],
        *,
        result: bytes | None,
        result_state: ResultState,
        retention_ms: int,
    ) -> bool:
        """:meth:`complete`, written now; ``on_reply`` gets its outcome when the reply is read.

        The reply is read by this thread's next script on this store, which rides
        behind it on the same connection, or by :func:`~effectq.store.redis.wire.sync.flush_pending`
        (a run's end): the completion lands as soon as Redis reads it, the caller
        just does not wait for the answer. ``on_reply`` gets what :meth:`complete`
        would return, or the :class:`~effectq.errors.StoreError` it would raise.
        Returns False when the completion was not written (no lane, replicas to
        wait for, or the write failed): the caller completes the usual way.
        """
        lane = self._lane
        if lane is None or self._wait_replicas:
            return False
        keys, args = self._complete_args(key, token, result, result_state, retention_ms)
        sha, source = self._scripts["complete"].sha, self._sources["complete"]
        if events._tracers:  # APM cannot see the wire (see traced.py): a span of effectq's own
            post = functools.partial(lane.send_pipelined, sha, source, keys, args)
            return post_traced("complete", self._peer, post, self._settled(key, on_reply))
        return lane.send_pipelined(sha, source, keys, args, self._settled(key, on_reply))

    def _complete_args(
        self, key: str, token: int, result: bytes | None, result_state: ResultState, retention_ms: int
    ) -> tuple[Sequence[str], list[Any]]:
        """complete.lua's keys and arguments, waited for or posted alike."""
        payload = result if result_state is _STORED and result is not None else b""
        layout = self._layout_of(key)
        keys = layout.script_keys
        channel = self._channel(keys[0])
        # _value_, not .value: an Enum's value is a property, two Python calls on every completion
        state = result_state._value_
        return keys, [token, payload, state, retention_ms, channel, layout.digest, self._publish]

    def release(self, key: str, token: int, *, error: str, retention_ms: int, ran: bool = True) -> bool:
        keys = self._keys(key)
        args = [token, error, retention_ms, self._channel(keys[0]), self._publish, "" if ran else "n"]
        return bool(self._run("release", key, keys[:2], args))

    def mark_unknown(self, key: str, token: int, *, error: str, ran: bool = True) -> bool:
        keys = self._keys(key)
        args = [token, error, self._channel(keys[0]), self._publish, "" if ran else "n"]
        return bool(self._run("mark_unknown", key, keys, args))

    def fail(self, key: str, token: int, *, error: str, failure: str, retention_ms: int) -> bool:
        keys = self._keys(key)
        args = [token, error, failure, retention_ms, self._channel(keys[0]), self._publish]
        return bool(self._run("fail", key, keys[:2], args))

    def dispatch(
        self, key: str, token: int, *, lease_ms: int, max_attempts: int = 0, retention_ms: int = 0
    ) -> int:
        keys = self._keys(key)
        args = [token, lease_ms, max_attempts, retention_ms, self._channel(keys[0]), self._publish]
        reply, acknowledged = self._run_replicated("dispatch", key, keys, args)
        attempt = int(reply)
        if attempt > 0 and self._short(acknowledged):
            claim = Claim(ClaimKind.CLAIMED, token=token, attempt=attempt, status=Status.DISPATCHED)
            raise ClaimNotReplicatedError(
                key, claim=claim, acknowledged=acknowledged, required=self._wait_replicas
            )
        return attempt

    def renew(self, key: str, token: int, *, lease_ms: int) -> bool:
        keys = self._keys(key)
        return bool(self._run("renew", key, keys[:2], [token, lease_ms]))

    def resolve(
        self,
        key: str,
        *,
        applied: bool,
        result: bytes | None = None,
        result_state: ResultState = ResultState.STORED,
        note: str = "",
        retention_ms: int,
    ) -> Record:
        if applied and result is None and result_state is ResultState.STORED:
            result_state = ResultState.RESOLVED_WITHOUT_RESULT  # nothing to replay: say so
        payload = result if result is not None and result_state is ResultState.STORED else b""
        keys = self._keys(key)
        ok, status = self._run(
            "resolve",
            key,
            keys,
            [
                "applied" if applied else "not_applied",
                payload,
                result_state.value,
                note,
                retention_ms,
                self._channel(keys[0]),
                self._publish,
            ],
        )
        if int(ok) < 0:
            raise CorruptRecordError(key, f"the Redis key holds {text(status)}")
        if not int(ok):
            found = STATUS.get(status) if status else None
            raise ResolveRefusedError(key, found.value if found else None, _refusal(found))
        record = self.get(key)
        if record is None:  # pragma: no cover - deleted between the two calls
            raise ResolveRefusedError(key, None, "the record vanished right after it was settled")
        return record

    def watch(self, key: str, callback: Callable[[], None]) -> Unsubscribe:
        return self._notifier.watch(self.record_key(key), callback)

    def close(self) -> None:
        """Try once more the writes the heartbeat still retries for this store (each that does
        not land is logged with what to do), stop the notification listener, and hand the
        lane's connections back (the client stays open: it is the caller's; the async lane's
        connections close with their event loops)."""
        heartbeat.settle_repairs(self)
        self._notifier.close()
        if self._lane is not None:
            self._lane.close()


def _hand_back(lane: sync.Lane | None, notifier: Notifier) -> None:
    """A store collected without ``close()``: its lane's connections go back to the client's
    pool, as redis-py's own ``PubSub`` and ``Pipeline`` hand theirs back when collected, and its
    notification listener stops (its thread holds the notifier, not the store), closing its own."""
    with contextlib.suppress(Exception):  # a finalizer has no caller to tell
        notifier.close()
    if lane is not None:
        with contextlib.suppress(Exception):
            lane.close()


def _replica_count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(f"wait_replicas must be a whole number of replicas (0: none), not {value!r}")
    return value


def _refusal(status: Status | None) -> str:
    if status is Status.COMPLETED:
        return "it is completed; a completed effect is never re-run or rewritten"
    if status is Status.RELEASED:
        return "it is released (not applied); the next call applies it"
    if status in (Status.DISPATCHED, Status.PENDING):
        return "it is in flight with a live lease; wait for it, or for the lease to run out"
    return ""
