"""Waiting for replicas: a script and ``WAIT``, on one connection, in one round trip.

``WAIT numreplicas timeout`` waits for the replicas to acknowledge the writes
*of the connection it is sent on*, so it must follow the script on the same
connection. A pipeline of the two does that without a second round trip: the
call takes as long as the primary's reply plus the replica's acknowledgement.

On Redis Cluster the pipeline goes to the slot's primary directly (redis-py's
cluster pipeline would send a keyless ``WAIT`` to every node), so this module
follows the redirections itself: ``MOVED`` refreshes the slot map and tries the
new owner, ``ASK`` sends ``ASKING`` and the script to the importing node,
``TRYAGAIN`` (a slot half-migrated) tries again shortly. A redirection means
the script did not run, so trying again never applies a transition twice; a
lost connection refreshes the slot map and becomes a store error, which the
engine retries with the same owner (the scripts write on such a retry, so the
``WAIT`` after it covers the first try's write too).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from ...errors import StoreError

__all__ = ["run_and_wait"]

_ATTEMPTS = 8
_TRYAGAIN_PAUSE = 0.05


def run_and_wait(
    client: Any,
    script: Any,
    keys: Sequence[str],
    args: list[Any],
    *,
    replicas: int,
    timeout_ms: int,
    cluster: bool,
) -> tuple[Any, int]:
    """Run a registered script, then ``WAIT`` on the same connection.

    Returns:
        (the script's reply, how many replicas acknowledged within ``timeout_ms``).
    """
    from redis.exceptions import (
        AskError,
        ConnectionError,
        MovedError,
        NoScriptError,
        TimeoutError,
        TryAgainError,
    )

    target = _primary(client, keys[0]) if cluster else client
    asking = False
    for _ in range(_ATTEMPTS):
        pipe = target.pipeline(transaction=False)
        if asking:
            pipe.execute_command("ASKING")
        pipe.evalsha(script.sha, len(keys), *keys, *args)
        pipe.execute_command("WAIT", replicas, timeout_ms)
        try:
            *_, reply, acknowledged = pipe.execute(raise_on_error=False)
        except (ConnectionError, TimeoutError):
            if cluster:
                _refresh(client)
            raise
        asking = False
        if isinstance(reply, NoScriptError):
            script.sha = target.script_load(script.script)
        elif isinstance(reply, MovedError):
            _refresh(client)
            target = _primary(client, keys[0])
        elif isinstance(reply, AskError):
            target, asking = _node(client, reply.host, reply.port), True
        elif isinstance(reply, TryAgainError):
            time.sleep(_TRYAGAIN_PAUSE)
        elif isinstance(reply, Exception):
            raise reply
        elif isinstance(acknowledged, Exception):
            raise acknowledged
        else:
            return reply, int(acknowledged)
    raise StoreError(f"the slot of {keys[0]!r} kept moving; gave up after {_ATTEMPTS} redirections")


def _primary(client: Any, key: str) -> Any:
    return client.get_redis_connection(client.get_node_from_key(key))


def _node(client: Any, host: str, port: int) -> Any:
    from redis.cluster import ClusterNode

    node = client.get_node(host=host, port=port) or ClusterNode(host, port)  # type: ignore[no-untyped-call]
    return client.get_redis_connection(node)


def _refresh(client: Any) -> None:
    with contextlib.suppress(Exception):  # the next call tries again; the caller reports its own error
        client.nodes_manager.initialize()
