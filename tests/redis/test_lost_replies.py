"""An effect whose own Redis call lost its reply to a closed connection: maybe applied, never run again.

The function's Redis write (its side effect, or the bookkeeping after it) reached the server and
applied, then the connection closed before the reply came back: a Redis killed or failed over
after the write, a proxy or load balancer dropping the connection, an output buffer limit. When
the peer closes cleanly (a FIN, not a reset), redis-py raises its ``ConnectionError("Connection
closed by server.")`` over no other exception: it must mean "maybe applied", as the same error over
a ``ConnectionResetError`` does, not "not applied", or the next delivery applies the effect again.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio

import effectq
from effectq.options import classifier
from tests.support.lossy import LossyProxy
from tests.support.servers import Server


@pytest.fixture
def dropper(redis_url: str, namespace: str) -> Iterator[LossyProxy]:
    """A relay to the real Redis that closes the connection of the first request naming the test's
    namespace, cleanly, as that request's reply comes (so the server applied it)."""
    relay, _ = LossyProxy.for_url(redis_url)
    relay.lose_reply_to(namespace.encode(), close=True)
    yield relay
    relay.close()


def test_a_reply_lost_to_a_closed_connection_is_unknown(
    redis_store: effectq.RedisStore, redis_url: str, dropper: LossyProxy, namespace: str
) -> None:
    applied: list[str] = []
    ledger = redis.Redis.from_url(redis_url)
    lossy = redis.Redis(port=dropper.port, retry=None)
    paths = [lossy, ledger]  # the first call's reply is lost; a later one's path is whole

    @effectq.effect(name="credit.add")
    def credit(account: str) -> str:
        applied.append(account)
        paths.pop(0).incr(f"{namespace}:credit:{account}")  # applied on the server
        return "credited"

    run = str(uuid.uuid4())
    with effectq.run(run, store=redis_store), pytest.raises(redis.exceptions.ConnectionError) as raised:
        credit("ada")
    assert str(raised.value) == "Connection closed by server."
    assert dropper.answered == 1 and ledger.get(f"{namespace}:credit:ada") == b"1"
    with effectq.run(run, store=redis_store), pytest.raises(effectq.OutcomeUnknown) as info:
        credit("ada")  # the redelivery: not credited again
    assert applied == ["ada"] and ledger.get(f"{namespace}:credit:ada") == b"1"
    assert "ConnectionError" in info.value.reason
    record = redis_store.get(info.value.key)
    assert record is not None and record.status is effectq.Status.UNKNOWN
    ledger.delete(f"{namespace}:credit:ada")
    ledger.close()
    lossy.close()


def test_a_call_after_its_redis_was_killed_is_unknown(
    redis_store: effectq.RedisStore, tmp_path: Path, namespace: str
) -> None:
    """The function's own Redis (not the store's) SIGKILLed between two of its calls, after its
    side effect: the pooled connection is found closed by the server, the reconnect refused.
    redis-py raises the refusal over the closed connection (as the chaos redis-restart run with
    effects writing their results there showed): maybe applied, not released and applied again."""
    server = Server(tmp_path).start()
    applied: list[str] = []
    own = redis.Redis(host="127.0.0.1", port=server.port, retry=None, socket_connect_timeout=2)
    try:
        own.ping()  # a pooled connection, as a worker's client has one

        @effectq.effect(name="mail.send")
        def send(to: str) -> str:
            applied.append(to)  # the email went out
            server.kill()  # its Redis dies (OOM killer, node drain) before the bookkeeping write
            own.set(f"{namespace}:sent:{to}", 1)
            return "sent"

        run = str(uuid.uuid4())
        with effectq.run(run, store=redis_store), pytest.raises(redis.exceptions.ConnectionError) as raised:
            send("ada@example.com")
        assert isinstance(raised.value.__context__, ConnectionRefusedError)
        with effectq.run(run, store=redis_store), pytest.raises(effectq.OutcomeUnknown):
            send("ada@example.com")  # the redelivery: not sent again
        assert applied == ["ada@example.com"]
    finally:
        own.close()
        server.stop()


def test_the_asyncio_client_losing_its_reply_is_maybe_applied(dropper: LossyProxy, namespace: str) -> None:
    """redis.asyncio raises the same error ``from None``: the error alone says the reply was lost."""

    async def lose() -> BaseException:
        client = redis.asyncio.Redis(port=dropper.port, retry=None)
        try:
            await client.set(f"{namespace}:seen", 1, ex=10)
        except redis.exceptions.ConnectionError as exc:
            return exc
        finally:
            await client.aclose()
        raise AssertionError("the reply came back")

    lost = asyncio.run(lose())
    assert str(lost) == "Connection closed by server." and classifier(None)(lost)


def test_a_name_with_a_message_matches_that_message_alone() -> None:
    """``"name: message"`` matches the class and its subclasses with that message, no other: a
    failed connect (redis-py's ``ConnectionError`` with another message, over nothing) stays
    "not applied"."""

    class Lost(redis.exceptions.ConnectionError):
        pass

    maybe_applied = classifier(["redis.exceptions.ConnectionError: Connection closed by server."])
    assert maybe_applied(redis.exceptions.ConnectionError("Connection closed by server."))
    assert maybe_applied(Lost("Connection closed by server."))
    assert not maybe_applied(redis.exceptions.ConnectionError("Error 111 connecting to localhost:1."))
    assert not maybe_applied(ConnectionError("Connection closed by server."))  # the builtin: another class
    assert not classifier(None)(redis.exceptions.ConnectionError("Error 111 connecting to localhost:1."))
