"""A completion is written before its effect returns; its reply is read later, on the real Redis.

Inside a run bound in the calling thread, an effect's completion is posted on
the store's lane: written at once, its reply read by the thread's next script
on that connection (which rides behind it) or at the run's end. These tests
hold what that must not change: the record is completed as soon as Redis reads
the write, a worker killed right after the effect returned leaves it
completed, a flushed script cache, a claim taken over and a connection lost
before the reply was read are each handled as a completion waited for would
be, and nothing is owed once the run ends.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import signal
import textwrap
import threading
import time
import uuid
from typing import Any

import pytest
import redis

import effectq
from effectq import events
from effectq._runtime.leases import heartbeat
from effectq.store.redis.wire.posted import ignore
from effectq.store.redis.wire.sync import Lane
from tests.support.procs import killed_after_first_line


@pytest.fixture(scope="module")
def redis_url(private_redis_url: str) -> str:
    """These tests flush the script cache and pause clients: they run on a server of their own."""
    return private_redis_url


@pytest.fixture
def store(redis_store: effectq.RedisStore) -> effectq.RedisStore:
    assert redis_store._lane is not None  # the path under test
    return redis_store


def _owes(store: effectq.RedisStore) -> int:
    """How many posts' replies this thread owes on the store's lane (a ``SCRIPT LOAD`` written
    ahead of one is not counted)."""
    lane = store._lane
    assert lane is not None
    pending = getattr(lane._local, "pending", None) or [] if getattr(lane._local, "conn", None) else []
    return sum(on_reply is not ignore for on_reply, _, _ in pending)


def test_the_completion_lands_before_the_effect_returns_and_its_reply_by_the_run_s_end(
    store: effectq.RedisStore, onlooker: effectq.RedisStore
) -> None:
    keys: list[str] = []

    @effectq.effect(name="posted.send")
    def send(to: str) -> str:
        keys.append(effectq.current_effect().key)
        return f"sent to {to}"

    with effectq.run(f"posted-{uuid.uuid4().hex[:8]}", store=store):
        assert send("a@example.com") == "sent to a@example.com"
        assert _owes(store) == 1  # written, its reply not read yet
        record = onlooker.get(keys[0])  # another connection: Redis ran the completion already
        assert record is not None and record.status is effectq.Status.COMPLETED
        assert send("b@example.com") == "sent to b@example.com"
        assert _owes(store) == 1  # the second claim read the first reply; the second's is owed
    assert _owes(store) == 0
    lane = store._lane
    assert lane is not None and len(lane._idle) == 1  # the connection is the lane's again
    for key in keys:
        record = onlooker.get(key)
        assert record is not None and record.status is effectq.Status.COMPLETED


def test_a_worker_killed_right_after_the_effect_returned_leaves_it_completed(
    redis_url: str, namespace: str, onlooker: effectq.RedisStore, tmp_path: Any
) -> None:
    """SIGKILL between the effect's return and the reading of its reply: the record is completed,
    and the redelivered run replays it instead of applying it again."""
    applied = tmp_path / "applied"
    program = textwrap.dedent(
        f"""
        import sys, time, effectq
        store = effectq.RedisStore.from_url({redis_url!r}, namespace={namespace!r})

        @effectq.effect(name="posted.charge")
        def charge(cents: int) -> str:
            with open({str(applied)!r}, "a") as f:
                f.write("charged\\n")
            return f"charged {{cents}}"

        with effectq.run("order-7", store=store):
            charge(500)
            print(effectq.current_run().store._lane._local.conn is not None, flush=True)
            time.sleep(60)  # killed here: the reply of the completion never read
        """
    )
    assert killed_after_first_line(program) == "True"  # it did owe the reply when killed

    @effectq.effect(name="posted.charge")
    def charge(cents: int) -> str:
        with open(applied, "a") as f:
            f.write("charged again\n")
        return f"charged {cents}"

    with effectq.run("order-7", store=onlooker):
        assert charge(500) == "charged 500"
    assert applied.read_text() == "charged\n"


def test_a_flushed_script_cache_loads_the_script_and_runs_the_completion_again(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_client: redis.Redis, caplog: Any
) -> None:
    keys: list[str] = []

    @effectq.effect(name="posted.flush")
    def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        redis_client.script_flush()  # the completion, posted next, meets NOSCRIPT
        return n

    with caplog.at_level(logging.WARNING), effectq.run(f"flush-{uuid.uuid4().hex[:8]}", store=store):
        assert act(1) == 1
        assert act(2) == 2  # its claim rides behind the first completion; it meets NOSCRIPT too
    assert [r.getMessage() for r in caplog.records if r.name.startswith("effectq")] == []
    for key in keys:
        record = onlooker.get(key)
        assert record is not None and record.status is effectq.Status.COMPLETED
    assert heartbeat.pending()[1] == 0  # settled where it was read, not left to the background


def test_a_claim_taken_over_meanwhile_is_logged_when_the_reply_is_read(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, caplog: Any
) -> None:
    @effectq.effect(name="posted.stolen")
    def act(n: int) -> int:
        ctx = effectq.current_effect()
        assert onlooker.release(ctx.key, ctx.token, error="taken over", retention_ms=60_000)
        return n

    with caplog.at_level(logging.ERROR), effectq.run(f"stolen-{uuid.uuid4().hex[:8]}", store=store):
        assert act(3) == 3  # applied: the caller gets its value
        assert not caplog.records  # the refusal is not known yet
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "was taken over or settled by someone else" in messages[0]


def test_a_reply_lost_with_its_connection_is_recorded_in_the_background(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_url: str, caplog: Any
) -> None:
    """Redis paused, the completion queued, the connection killed: the reply never comes. The
    heartbeat thread completes it again (the same token), as it would a completion that failed."""
    keys: list[str] = []
    admin = redis.Redis.from_url(redis_url)

    @effectq.effect(name="posted.lost")
    def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        admin.execute_command("CLIENT", "PAUSE", "400", "WRITE")
        return n

    try:
        with caplog.at_level(logging.ERROR), effectq.run(f"lost-{uuid.uuid4().hex[:8]}", store=store):
            assert act(4) == 4
            lane = store._lane
            assert lane is not None
            conn = lane._local.conn
            admin.execute_command("CLIENT", "KILL", "ID", _client_id(admin, conn))
    finally:
        admin.close()
    assert any("recording it failed" in r.getMessage() for r in caplog.records)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        record = onlooker.get(keys[0])
        if record is not None and record.status is effectq.Status.COMPLETED:
            break
        time.sleep(0.05)
    record = onlooker.get(keys[0])
    assert record is not None and record.status is effectq.Status.COMPLETED
    assert heartbeat.pending()[1] == 0


def _client_id(admin: redis.Redis, conn: Any) -> int:
    """The server's id of one of our connections, found by its local port."""
    port = conn._sock.getsockname()[1]
    for entry in admin.client_list():
        if entry["addr"].endswith(f":{port}"):
            return int(entry["id"])
    raise AssertionError(f"no client on port {port}")


_where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="outside")


def test_with_an_event_listener_on_the_completed_event_comes_with_the_reply(
    store: effectq.RedisStore,
) -> None:
    """Listeners (metrics, tracing) get each completed event once its reply is read, in the
    context the effect was called in, before the next call's events; its duration is the write's."""
    seen: list[tuple[str, str, str, float]] = []

    def listen(event: events.Event) -> None:
        seen.append((event.kind.value, event.key, _where.get(), event.duration))

    unsubscribe = events.subscribe(listen)

    @effectq.effect(name="posted.listened")
    def act(n: int) -> int:
        time.sleep(0.05)  # a side effect that takes a while: not part of the completion's duration
        return n

    try:
        with effectq.run(f"listened-{uuid.uuid4().hex[:8]}", store=store):
            k5, k6 = act.key(5), act.key(6)
            _where.set("first")
            act(5)
            assert [kind for kind, *_ in seen] == ["claimed", "executed"]
            assert _owes(store) == 1  # posted, although a listener is on
            _where.set("second")
            act(6)
            assert [(kind, key, where) for kind, key, where, _ in seen] == [
                ("claimed", k5, "first"),
                ("executed", k5, "first"),
                ("completed", k5, "first"),  # read with the next claim's reply, in the first's context
                ("claimed", k6, "second"),
                ("executed", k6, "second"),
            ]
            _where.set("third")
        assert seen[-1][:3] == ("completed", k6, "second")  # the run's end read the last reply
        completed = [duration for kind, _, _, duration in seen if kind == "completed"]
        assert all(0 <= duration < 0.05 for duration in completed)  # the write, not the wait after it
    finally:
        unsubscribe()


def test_an_effect_called_from_another_thread_waits_for_its_completion(
    store: effectq.RedisStore,
) -> None:
    """Only the thread that bound the run reads replies at its end: others wait for theirs."""

    @effectq.effect(name="posted.thread")
    def act(n: int) -> int:
        return n

    owed: list[int] = []

    def call() -> None:
        act(6)
        owed.append(_owes(store))

    with effectq.run(f"thread-{uuid.uuid4().hex[:8]}", store=store):
        worker = threading.Thread(target=contextvars.copy_context().run, args=(call,))
        worker.start()
        worker.join()
    assert owed == [0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_neither_reads_nor_writes_its_parent_s_owed_connection(
    store: effectq.RedisStore, onlooker: effectq.RedisStore
) -> None:
    keys: list[str] = []

    @effectq.effect(name="posted.fork")
    def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        return n

    with effectq.run(f"fork-{uuid.uuid4().hex[:8]}", store=store):
        act(7)
        assert _owes(store) == 1
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                with effectq.run(f"child-{uuid.uuid4().hex[:8]}", store=store):
                    code = 0 if _owes(store) == 0 and act(8) == 8 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert act(9) == 9  # the parent's connection is as it left it: the reply read in order
    for key in keys:
        record = onlooker.get(key)
        assert record is not None and record.status is effectq.Status.COMPLETED


def test_the_lane_settles_posts_in_order_before_the_next_reply(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    lane = Lane(client.connection_pool)
    sha = client.script_load("return ARGV[1]")
    settled: list[Any] = []
    try:
        for n in range(3):
            assert lane.send_pipelined(sha, "return ARGV[1]", [], [n], settled.append)
        assert settled == []
        assert lane.evalsha(sha, "return ARGV[1]", [], ["last"], retry=True) == b"last"
        assert settled == [b"0", b"1", b"2"]
        assert lane.send_pipelined(sha, "return ARGV[1]", [], ["end"], settled.append)
        lane.flush()
        assert settled[-1] == b"end"
        assert len(lane._idle) == 1 and getattr(lane._local, "conn", None) is None
    finally:
        lane.close()
        client.close()


def test_a_post_that_cannot_be_written_says_so_and_settles_what_was_owed(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    lane = Lane(client.connection_pool)
    sha = client.script_load("return ARGV[1]")
    settled: list[Any] = []
    try:
        assert lane.send_pipelined(sha, "return ARGV[1]", [], [1], settled.append)
        lane._local.conn._sock.close()  # the next write fails
        assert not lane.send_pipelined(sha, "return ARGV[1]", [], [2], settled.append)
        assert len(settled) == 1 and isinstance(settled[0], redis.ConnectionError | OSError)
        assert getattr(lane._local, "conn", None) is None
        assert lane.evalsha(sha, "return ARGV[1]", [], [3], retry=True) == b"3"  # a fresh connection
    finally:
        lane.close()
        client.close()


def test_a_post_whose_connection_is_opened_again_as_it_writes_settles_what_was_owed_as_lost(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread's ``pool.disconnect()`` lands between the check of a connection that owes a
    reply and the write behind it, which redis-py makes on a socket it opens afresh: the reply owed
    can come on no socket now. It is settled as lost, the post reported unwritten, and no reply is
    ever taken for another's (none is waited for in vain either)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=2)
    lane = Lane(client.connection_pool)
    sha = client.script_load("return ARGV[1]")
    settled: list[Any] = []
    write = Lane._write

    def closed_first(self: Lane, conn: Any, frame: bytes) -> None:
        client.connection_pool.disconnect()  # as another thread may, at the worst moment
        write(self, conn, frame)

    try:
        assert lane.send_pipelined(sha, "return ARGV[1]", [], [1], settled.append)
        monkeypatch.setattr(Lane, "_write", closed_first)
        assert not lane.send_pipelined(sha, "return ARGV[1]", [], [2], settled.append)
        monkeypatch.setattr(Lane, "_write", write)
        assert len(settled) == 1 and isinstance(settled[0], redis.ConnectionError), settled
        assert "closed while replies were pending" in str(settled[0])
        lane.flush()
        assert len(settled) == 1
        assert lane.evalsha(sha, "return ARGV[1]", [], [3], retry=True) == b"3"
    finally:
        lane.close()
        client.close()


def test_a_claim_that_times_out_behind_an_owed_reply_keeps_that_reply(
    redis_url: str, namespace: str, onlooker: effectq.RedisStore, caplog: Any
) -> None:
    """The owed completion's reply came before the claim behind it timed out (Redis paused
    between the two): the completion settles as recorded, nothing is written again, and no
    failure is logged for it."""
    client = redis.Redis.from_url(redis_url, socket_timeout=0.3)
    store = effectq.RedisStore(client, namespace=namespace)
    admin = redis.Redis.from_url(redis_url)
    keys: list[str] = []

    @effectq.effect(name="posted.behind_timeout")
    def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        return n

    try:
        with (
            caplog.at_level(logging.INFO, logger="effectq"),
            effectq.run(f"bt-{uuid.uuid4().hex[:8]}", store=store),
        ):
            act(1)
            assert _owes(store) == 1
            admin.execute_command("CLIENT", "PAUSE", "1500", "WRITE")  # the next claim times out
            with contextlib.suppress(effectq.StoreError):
                act(2)
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
        store.close()
        client.close()
    assert not [r.getMessage() for r in caplog.records if r.name == "effectq.complete"]
    record = onlooker.get(keys[0])
    assert record is not None and record.status is effectq.Status.COMPLETED
    deadline = time.monotonic() + 10
    while heartbeat.pending()[1] and time.monotonic() < deadline:  # the claim of 2, given back
        time.sleep(0.05)
    assert heartbeat.pending()[1] == 0


def test_a_time_limit_before_the_owed_reply_came_writes_it_again_quietly(
    store: effectq.RedisStore, onlooker: effectq.RedisStore, redis_url: str, caplog: Any
) -> None:
    """A worker's time limit lands while the run's end waits for the owed reply (Redis paused
    before it ran the completion): the reply is never read, so the heartbeat writes the
    completion again (the same token) and says so at INFO, as after a cancel: a time limit
    is no failure of Redis. The record ends completed."""
    from billiard.exceptions import SoftTimeLimitExceeded

    admin = redis.Redis.from_url(redis_url)
    keys: list[str] = []

    @effectq.effect(name="posted.time_limit_unread")
    def act(n: int) -> int:
        keys.append(effectq.current_effect().key)
        admin.execute_command("CLIENT", "PAUSE", "600", "WRITE")  # its completion waits
        return n

    def time_limit(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGALRM, time_limit)
    try:
        with (
            caplog.at_level(logging.INFO, logger="effectq"),
            contextlib.suppress(SoftTimeLimitExceeded),
            effectq.run(f"tl-{uuid.uuid4().hex[:8]}", store=store),
        ):
            assert act(3) == 3
            assert _owes(store) == 1
            signal.setitimer(signal.ITIMER_REAL, 0.15)  # lands while the run's end reads
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "effectq.complete"]
    assert len(messages) == 1 and messages[0][0] == logging.INFO and "reply not read" in messages[0][1]
    deadline = time.monotonic() + 10
    while heartbeat.pending()[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    record = onlooker.get(keys[0])
    assert record is not None and record.status is effectq.Status.COMPLETED
    assert heartbeat.pending()[1] == 0
