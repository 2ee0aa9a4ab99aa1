"""The store's own EVALSHA lane on redis-py's pooled connections, against the real Redis.

It must behave like redis-py where it matters: both protocols and both parsers,
scripts reloaded after a flush, a connection killed while idle, a fork, a
timeout, and a pool that gets its connections back.
"""

from __future__ import annotations

import logging
import os
import uuid

import pytest
import redis
import redis.sentinel
from hypothesis import given, settings
from hypothesis import strategies as st
from redis._parsers import _RESP2Parser, _RESP3Parser

import effectq
from effectq.store.base import ClaimKind, ClaimRequest, ResultState
from effectq.store.redis.wire import frames
from effectq.store.redis.wire.frames import _pack_command
from effectq.store.redis.wire.sync import Lane, lane_for
from tests.conftest import delete_namespace
from tests.support.collected import verdict


@pytest.fixture(scope="module")
def redis_url(private_redis_url: str) -> str:
    """These tests flush the script cache and pause clients: they run on a server of their own."""
    return private_redis_url


def _effect(calls: list[int]) -> effectq.Effect[[int], dict[str, int]]:
    @effectq.effect(name="lane.double")
    def double(n: int) -> dict[str, int]:
        calls.append(n)
        return {"n": n * 2}

    return double


def _client(redis_url: str, **kwargs: object) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(redis_url, **kwargs)
    return redis.Redis(connection_pool=pool)


@pytest.mark.parametrize(
    ("protocol", "parser"),
    [(2, _RESP2Parser), (3, _RESP3Parser), (2, None), (3, None)],
    ids=["resp2-python", "resp3-python", "resp2-default", "resp3-default"],
)
def test_effects_run_and_replay_on_every_protocol_and_parser(
    redis_url: str, namespace: str, protocol: int, parser: type | None
) -> None:
    """Claims, completions, replays and every reply shape read the same on RESP2 and RESP3."""
    options: dict[str, object] = {"protocol": protocol}
    if parser is not None:
        options["parser_class"] = parser
    client = _client(redis_url, **options)
    store = effectq.RedisStore(client, namespace=namespace)
    assert store._lane is not None
    calls: list[int] = []
    double = _effect(calls)
    try:
        with effectq.run("r1", store=store):
            assert [double(i) for i in range(3)] == [{"n": 0}, {"n": 2}, {"n": 4}]
        with effectq.run("r1", store=store) as again:  # a redelivery: replay, then the prefetch
            assert [double(i) for i in range(3)] == [{"n": 0}, {"n": 2}, {"n": 4}]
        assert calls == [0, 1, 2]
        assert again.stats.replayed == 3
    finally:
        delete_namespace(client, namespace)
        store.close()
        client.close()


@pytest.mark.parametrize("via_execute_command", [False, True], ids=["wire", "execute-command"])
def test_scripts_are_loaded_again_after_a_flush(
    redis_client: redis.Redis, namespace: str, via_execute_command: bool
) -> None:
    """SCRIPT FLUSH (or a restarted Redis) makes EVALSHA answer NOSCRIPT: the lane loads and reruns
    (and so does redis-py's Script, on the execute_command path)."""
    store = effectq.RedisStore(redis_client, namespace=namespace, via_execute_command=via_execute_command)
    calls: list[int] = []
    double = _effect(calls)
    with effectq.run("flush", store=store):
        assert double(1) == {"n": 2}
        redis_client.script_flush()
        assert double(2) == {"n": 4}
        redis_client.script_flush()
        assert double(1) == {"n": 2}  # a replay after the flush
    assert calls == [1, 2]


def _kill_clients_of(client: redis.Redis, name: str) -> int:
    """Kill every connection named ``name`` (as the server would after a restart); how many."""
    mine = [c["id"] for c in client.client_list() if c.get("name") == name]
    return sum(1 for ident in mine if client.client_kill_filter(_id=ident))


def test_a_connection_killed_while_idle_is_replaced(redis_url: str, namespace: str) -> None:
    """A claim or completion retries once on a new connection; other scripts fail clearly, then recover."""
    name = f"lane-{uuid.uuid4().hex[:8]}"
    client = _client(redis_url, client_name=name)
    admin = redis.Redis.from_url(redis_url)
    store = effectq.RedisStore(client, namespace=namespace)
    calls: list[int] = []
    double = _effect(calls)
    try:
        with effectq.run("killed", store=store):
            assert double(1) == {"n": 2}
            assert _kill_clients_of(admin, name) >= 1
            assert double(2) == {"n": 4}
            assert _kill_clients_of(admin, name) >= 1
            assert double(1) == {"n": 2}
        assert calls == [1, 2]
        # at the store itself, with no engine retry around it: a claim and a completion go through
        claim = store.claim("killed:direct", ClaimRequest(lease_ms=10_000, owner="direct:1"))
        assert _kill_clients_of(admin, name) >= 1
        assert store.claim("killed:direct", ClaimRequest(lease_ms=10_000, owner="direct:1")) == claim
        assert _kill_clients_of(admin, name) >= 1
        assert store.complete(
            "killed:direct", claim.token, result=b"1", result_state=ResultState.STORED, retention_ms=60_000
        )
        # release is not retried (a second run could find another's claim): it fails, the next call works
        key = "killed:release-probe"
        claim = store.claim(key, ClaimRequest(lease_ms=10_000, owner="probe:1"))
        assert _kill_clients_of(admin, name) >= 1
        with pytest.raises(effectq.StoreError):
            store.release(key, claim.token, error="probe", retention_ms=60_000)
        assert store.release(key, claim.token, error="probe", retention_ms=60_000)
    finally:
        delete_namespace(admin, namespace)
        store.close()
        client.close()
        admin.close()


def test_a_timeout_is_not_retried_and_the_connection_is_dropped(redis_url: str, namespace: str) -> None:
    """A script that may still be running is never sent twice; its half-read connection is closed."""
    client = _client(redis_url, socket_timeout=1.0)
    admin = redis.Redis.from_url(redis_url)
    store = effectq.RedisStore(client, namespace=namespace)
    lane = store._lane
    assert lane is not None
    sent: list[bytes] = []
    real_send = lane._send

    def counting(conn: object, frame: bytes) -> object:
        sent.append(frame)
        return real_send(conn, frame)

    lane._send = counting  # type: ignore[method-assign]
    try:
        store.claim("warm", ClaimRequest(lease_ms=10_000, owner="w:1"))
        idle = list(lane._idle)
        admin.execute_command("CLIENT", "PAUSE", 600_000, "WRITE")  # scripts wait until the UNPAUSE
        sent.clear()
        with pytest.raises(effectq.StoreError, match=r"[Tt]imeout"):
            store.claim("paused", ClaimRequest(lease_ms=10_000, owner="p:1"))
        assert len(sent) == 1
        assert all(conn._sock is None for conn in idle)  # dropped, not handed out again
        admin.execute_command("CLIENT", "UNPAUSE")
        claim = store.claim("paused", ClaimRequest(lease_ms=10_000, owner="p:1"))
        assert claim.kind is ClaimKind.CLAIMED  # the paused try landed: the same owner gets it back
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        delete_namespace(admin, namespace)
        store.close()
        client.close()
        admin.close()


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _exercise(store: effectq.RedisStore, run_id: str, offset: int) -> bool:
    """First calls, then replays read back from Redis; False on any wrong value or logged error."""

    @effectq.effect(name="lane.tagged")
    def tagged(n: int) -> int:
        return offset + n

    errors = _Errors()
    logging.getLogger("effectq").addHandler(errors)
    try:
        with effectq.run(run_id, store=store):
            first = [tagged(i) for i in range(200)]
        with effectq.run(run_id, store=store) as again:
            again.prefetch_tried = True  # replay claim by claim: 200 more replies to cross
            replayed = [tagged(i) for i in range(200)]
    finally:
        logging.getLogger("effectq").removeHandler(errors)
    expected = [offset + i for i in range(200)]
    return first == expected and replayed == expected and not errors.records


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_writes_on_its_parents_connection(redis_url: str, namespace: str) -> None:
    """Parent and child run effects at once after a fork: each reads only its own replies."""
    client = _client(redis_url)
    store = effectq.RedisStore(client, namespace=namespace)
    store.claim("warm", ClaimRequest(lease_ms=10_000, owner="w:1"))
    assert store._lane is not None and store._lane._idle  # the lane holds a connection across the fork
    pid = os.fork()
    if pid == 0:  # the child
        code = 3
        try:
            code = 0 if _exercise(store, "child", 100_000) else 3
        finally:
            os._exit(code)
    try:
        ok = _exercise(store, "parent", 0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child read a reply that was not its own"
        assert ok, "the parent read a reply that was not its own"
    finally:
        delete_namespace(client, namespace)
        store.close()
        client.close()


def test_close_hands_the_connections_back_to_the_pool(redis_url: str, namespace: str) -> None:
    """The lane keeps connections out of the pool only while the store is open."""
    client = _client(redis_url)
    pool = client.connection_pool
    store = effectq.RedisStore(client, namespace=namespace)
    try:
        store.claim("k", ClaimRequest(lease_ms=10_000, owner="o:1"))
        assert len(pool._in_use_connections) == 1
        store.close()
        assert not pool._in_use_connections
        assert store.claim("k", ClaimRequest(lease_ms=10_000, owner="o:1")).kind is ClaimKind.CLAIMED
    finally:
        delete_namespace(client, namespace)
        store.close()
        client.close()


def test_a_store_never_closed_hands_its_connection_back_when_collected(
    redis_client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """A store dropped without close(), as redis-py's own PubSub and Pipeline may be: its lane's
    connection goes back to the client's pool, and the client's next command reuses it (asked in
    a process of its own: only effectq's references count there)."""
    result = verdict("store-dropped-after-a-run", redis_url, namespace)
    assert result["result"] == {"n": 2}
    assert result["alive"] == [], result["alive"]  # what holds the store still alive
    assert result["connections"] == 1


def test_a_store_whose_lease_was_renewed_is_collected_once_dropped(
    redis_client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """The heartbeat renewed a lease of the store's, then went back to sleep with no lease held:
    it keeps nothing of the store, so a store dropped without close() still hands back its
    connections and stops its listener."""
    result = verdict("store-dropped-after-its-lease-was-renewed", redis_url, namespace)
    assert result["result"] == 1 and result["renewed"], result
    assert result["alive"] == [], result["alive"]


def test_a_store_never_closed_stops_listening_when_collected(
    redis_client: redis.Redis, redis_url: str, namespace: str
) -> None:
    """A store dropped without close() after a waiter subscribed to its notifications: the
    listener stops and its connection, taken from the client's pool, is closed (a thread and a
    connection of the user's client are not kept for a store nobody holds)."""
    result = verdict("store-dropped-while-listening", redis_url, namespace)
    assert result["listening"] == 1
    assert result["alive"] == [], result["alive"]
    assert result["after"] == 0


def test_other_clients_go_through_redis_py(redis_url: str) -> None:
    """Subclasses, blocking pools and client-side caching keep redis-py's own command path."""

    class Custom(redis.Redis):
        pass

    assert lane_for(redis.Redis.from_url(redis_url)) is not None
    assert lane_for(Custom.from_url(redis_url)) is None
    assert lane_for(redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(redis_url))) is None
    sentinel = redis.sentinel.Sentinel([("127.0.0.1", 26379)])  # connects only when used
    assert lane_for(sentinel.master_for("mymaster")) is None  # READONLY after a failover is its pool's
    if hasattr(redis, "cache"):  # client-side caching came with redis-py 5.1
        caching = redis.Redis.from_url(redis_url, protocol=3, cache_config=redis.cache.CacheConfig())
        assert lane_for(caching) is None
    assert isinstance(lane_for(redis.Redis.from_url(redis_url)), Lane)


def test_bad_arguments_fail_before_anything_is_sent(redis_url: str) -> None:
    """An argument the lane cannot frame raises TypeError and leaves no connection checked out."""
    client = _client(redis_url)
    lane = lane_for(client)
    assert lane is not None
    for bad in (None, True, object()):
        with pytest.raises(TypeError, match="str, bytes, int or float"):
            lane.evalsha("0" * 40, "return 1", [], [bad], retry=True)
    assert not client.connection_pool._in_use_connections
    client.close()


def test_round_trips_through_the_lane(
    redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the lane as through redis-py: 2 round trips first time, 1 per replay, 1 to resume a run."""
    client = _client(redis_url)
    store = effectq.RedisStore(client, namespace=namespace)
    sent: list[str] = []
    lane_write = Lane._write
    redis_send = redis.connection.AbstractConnection.send_packed_command

    in_lane: list[bool] = []

    def on_lane(lane: Lane, conn: object, frame: bytes) -> None:
        sent.append(frame.split(b"\r\n")[2].decode())
        in_lane.append(True)  # the lane writes through send_packed_command: not redis-py's trip
        try:
            lane_write(lane, conn, frame)
        finally:
            in_lane.pop()

    def on_redis_py(conn: object, command: object, check_health: bool = True) -> None:
        if not in_lane:
            sent.append("redis-py")
        redis_send(conn, command, check_health)  # type: ignore[arg-type]

    calls: list[int] = []
    double = _effect(calls)
    try:
        with effectq.run("warm", store=store):
            double(-1)
        client.ping()  # the pool's own connection made (its handshake is not the store's)
        monkeypatch.setattr(Lane, "_write", on_lane)
        monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", on_redis_py)
        with effectq.run("trips", store=store):
            sent.clear()
            double(1)
            first = list(sent)
            for n in range(2, 21):
                double(n)
        with effectq.run("trips", store=store) as again:
            again.prefetch_tried = True
            sent.clear()
            double(1)
            replay = list(sent)
        with effectq.run("trips", store=store):
            sent.clear()
            assert [double(n) for n in range(1, 21)] == [{"n": 2 * n} for n in range(1, 21)]
            resumed = list(sent)
    finally:
        monkeypatch.undo()
        delete_namespace(client, namespace)
        store.close()
        client.close()
    assert first == ["EVALSHA", "EVALSHA"]
    assert replay == ["EVALSHA"]
    assert resumed == ["EVALSHA"]  # the first replay's reply brings the run's other records


_ARGUMENT = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
)


@pytest.mark.skipif(_pack_command is None, reason="this hiredis has no pack_command")
@settings(max_examples=300, deadline=None)
@given(keys=st.lists(_ARGUMENT, max_size=5), args=st.lists(_ARGUMENT, max_size=12))
def test_hiredis_frames_as_the_python_framing_does(keys: list[object], args: list[object]) -> None:
    """The lane frames with hiredis when it can; its bytes are the Python framing's, byte for byte."""
    sha = "a" * 40
    assert frames.frame(sha, keys, args) == frames.frame_python(sha, keys, args)


def test_arguments_reach_the_script_as_sent(redis_url: str) -> None:
    """Through the lane's framing (hiredis's, and the Python one for what hiredis refuses), the
    script sees each argument as redis-py would send it."""
    client = _client(redis_url)
    lane = lane_for(client)
    assert lane is not None
    echo = client.register_script("return ARGV")
    plain: list[object] = ["é-ü", b"\x00\r\n$", "", -7, 2**64, 1.25]
    expected = ["é-ü".encode(), b"\x00\r\n$", b"", b"-7", b"18446744073709551616", b"1.25"]
    assert lane.evalsha(echo.sha, echo.script, [], plain, retry=True) == expected
    assert echo(args=plain) == expected  # redis-py's own path agrees
    buffers: list[object] = [bytearray(b"ba"), memoryview(b"mv")]  # older redis-py refuses bytearray
    assert lane.evalsha(echo.sha, echo.script, [], buffers, retry=True) == [b"ba", b"mv"]
    lane.close()
    client.close()
