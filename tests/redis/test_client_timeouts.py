"""An effect whose own client times out after its side effect: maybe applied, never run again.

The function's Redis call (a cache write, a lock, a counter) waits on a server that does not
answer in time, as a frozen, failing-over or overloaded Redis does: redis-py raises its own
``TimeoutError`` (no ``builtins.TimeoutError``; on redis-py 8 every client has a 5 s socket
timeout by default). Whatever the function did before it may have applied: the record is
unknown, not released, so the next call does not apply it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

import effectq
from effectq.options import classifier
from tests.support.servers import free_port


@pytest.fixture
def impatient(redis_url: str) -> Iterator[redis.Redis]:
    """A client whose replies must come within 50 ms, with redis-py's default retries."""
    client = redis.Redis.from_url(redis_url, socket_timeout=0.05)
    yield client
    client.close()


def _stalls(client: redis.Redis, namespace: str) -> None:
    """A call the server answers later than the client waits (the BLPOP ends when the client
    hangs up): redis-py raises its ``TimeoutError``."""
    client.blpop([f"{namespace}:never"], timeout=1)


def test_a_redis_timeout_after_the_side_effect_is_unknown(
    redis_store: effectq.RedisStore, impatient: redis.Redis, namespace: str
) -> None:
    applied: list[str] = []

    @effectq.effect(name="mail.send")
    def send(to: str) -> str:
        applied.append(to)  # the email went out
        _stalls(impatient, namespace)  # then its bookkeeping write timed out
        return "sent"

    run = str(uuid.uuid4())
    with effectq.run(run, store=redis_store), pytest.raises(redis.exceptions.TimeoutError):
        send("ada@example.com")
    with effectq.run(run, store=redis_store), pytest.raises(effectq.OutcomeUnknown) as info:
        send("ada@example.com")  # the redelivery: not sent again
    assert applied == ["ada@example.com"]
    assert "TimeoutError" in info.value.reason
    record = redis_store.get(info.value.key)
    assert record is not None and record.status is effectq.Status.UNKNOWN


def test_a_redis_timeout_is_reconciled_when_a_hook_is_given(
    redis_store: effectq.RedisStore, impatient: redis.Redis, namespace: str
) -> None:
    sent: dict[str, str] = {}

    def find(key: str, args: dict[str, object], ctx: effectq.EffectContext) -> str | None:
        return sent.get(ctx.idempotency_key)

    @effectq.effect(name="mail.send", reconcile=find)
    def send(to: str) -> str:
        sent[effectq.current_effect().idempotency_key] = f"sent to {to}"
        _stalls(impatient, namespace)
        return "unreachable"

    run = str(uuid.uuid4())
    with effectq.run(run, store=redis_store), pytest.raises(redis.exceptions.TimeoutError):
        send("ada@example.com")
    with effectq.run(run, store=redis_store):
        assert send("ada@example.com") == "sent to ada@example.com"
    assert len(sent) == 1


def test_a_wrapped_reset_is_maybe_applied_and_a_refused_connection_is_not() -> None:
    """A client library's error raised while handling a reset or a timeout (redis-py's
    ConnectionError over a ConnectionResetError, requests' over urllib3's) means what the
    error it wraps means; one over a refused connection means nothing was sent."""
    maybe_applied = classifier(None)
    refused = redis.Redis(port=free_port(), socket_connect_timeout=1)
    with pytest.raises(redis.exceptions.ConnectionError) as info:
        refused.ping()
    assert not maybe_applied(info.value)

    def wrapped_reset() -> None:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError as exc:
            raise redis.exceptions.ConnectionError(f"Error while reading from socket: {exc.args}") from exc

    with pytest.raises(redis.exceptions.ConnectionError) as reset:
        wrapped_reset()
    assert maybe_applied(reset.value)

    class NotApplied(Exception):
        pass

    def said_so() -> None:
        try:
            raise TimeoutError("read timed out")
        except TimeoutError:
            raise NotApplied("the gateway says it did not charge") from None

    with pytest.raises(NotApplied) as told:
        said_so()
    assert not maybe_applied(told.value)  # `from None`: the function says what it means


def test_the_unknown_names_the_link_that_may_have_applied(
    redis_store: effectq.RedisStore, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A refused reconnect raised while handling a lost reply: the log and the record name both,
    so the operator who settles the unknown sees why it may have applied, not only the refusal."""
    applied: list[str] = []

    @effectq.effect(name="mail.send")
    def send(to: str) -> str:
        applied.append(to)
        try:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        except redis.exceptions.ConnectionError:
            # as redis-py's reconnect raises it: over the lost reply, as its traceback shows
            raise redis.exceptions.ConnectionError(  # noqa: B904
                "Error 111 connecting to 127.0.0.1:1. Connection refused."
            )

    run = str(uuid.uuid4())
    with (
        caplog.at_level("ERROR", logger="effectq"),
        effectq.run(run, store=redis_store),
        pytest.raises(redis.exceptions.ConnectionError),
    ):
        send("ada@example.com")
    with effectq.run(run, store=redis_store), pytest.raises(effectq.OutcomeUnknown) as info:
        send("ada@example.com")
    assert applied == ["ada@example.com"]
    logged = " ".join(r.getMessage() for r in caplog.records if "may mean it applied" in r.getMessage())
    for text in (logged, info.value.reason):
        assert "Connection refused" in text
        assert "while handling redis.exceptions.ConnectionError: Connection closed by server." in text
