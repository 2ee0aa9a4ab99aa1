"""``effectq doctor``: what in a Redis deployment breaks "at most once", and how to fix it.

Looking at a deployment is a loop over its nodes (one for a single Redis; every
node of a cluster), each given the checks of one server (:mod:`.node_checks`, where
each says why it matters), plus the checks of the namespace itself (what is in
doubt now)::

    findings = diagnose(store)
    failing = [f for f in findings if f.level is Level.FAIL]
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from .node_checks import (
    CHECKS,
    Check,
    Finding,
    Level,
    Node,
    check_clock,
    check_eviction,
    check_memory,
    check_persistence,
    check_replicas,
    check_scripts,
    check_version,
)

__all__ = [
    "CHECKS",
    "STARTUP_CHECKS",
    "Check",
    "Finding",
    "Level",
    "Node",
    "check_clock",
    "check_eviction",
    "check_in_doubt",
    "check_memory",
    "check_persistence",
    "check_replicas",
    "check_scripts",
    "check_version",
    "diagnose",
    "examine",
    "nodes",
    "startup_problems",
]

log = logging.getLogger("effectq.doctor")


def examine(node: Node, checks: tuple[Check, ...] = CHECKS) -> list[Finding]:
    """Run ``checks`` on one node; a check that cannot run is a SKIP, not a crash.

    A node that does not answer PING gets one FAIL finding (``reachable``) instead.
    """
    try:
        node.client.ping()
    except Exception as exc:
        return [
            Finding("reachable", Level.FAIL, f"does not answer: {exc}", "start it, or fix --url", node.name)
        ]
    found = []
    for check in checks:
        name = check.__name__.removeprefix("check_")
        try:
            finding = check(node)
        except Exception as exc:
            log.debug("effectq doctor: check %s on %s raised", name, node.name, exc_info=True)
            finding = Finding(name, Level.SKIP, f"could not check: {type(exc).__name__}: {exc}")
        found.append(Finding(finding.check, finding.level, finding.summary, finding.fix, node.name))
    return found


def nodes(client: Any, *, wait_replicas: int = 0) -> Iterator[Node]:
    """The servers behind a client: the one it talks to (a cluster client: each of its nodes,
    primaries and replicas)."""
    if hasattr(client, "get_nodes"):  # redis.cluster.RedisCluster
        for node in client.get_nodes():
            yield Node(client.get_redis_connection(node), node.name, wait_replicas=wait_replicas)
        return
    kwargs = client.connection_pool.connection_kwargs
    yield Node(client, f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}", wait_replicas=wait_replicas)


STARTUP_CHECKS: tuple[Check, ...] = (check_eviction,)
"""The checks a Celery or Dramatiq worker runs on its store's Redis when it starts: those
whose failure repeats effects however the workers are set up."""


def startup_problems(store: Any, checks: tuple[Check, ...] = STARTUP_CHECKS) -> list[str]:
    """The failures ``checks`` find on every node behind ``store``'s client, one sentence each
    with its fix: what the task-queue integrations log when a worker starts.

    A store without a Redis client (the memory store) has none; a node that does not answer,
    or a check that cannot run, is left to ``effectq doctor`` (the worker finds out soon enough).
    """
    client = getattr(store, "client", None)
    if client is None:
        return []
    wanted = {check.__name__.removeprefix("check_") for check in checks}
    return [
        f"Redis {finding.node}: {finding.summary}. Fix: {finding.fix}."
        for node in nodes(client, wait_replicas=getattr(store, "wait_replicas", 0))
        for finding in examine(node, checks)
        if finding.level is Level.FAIL and finding.check in wanted
    ]


def check_in_doubt(store: Any) -> Finding:
    """Records in doubt in the namespace (not a fault of the deployment, but someone must settle them)."""
    summary = store.summary()
    if not summary.in_doubt:
        return Finding("in doubt", Level.OK, f"namespace {store.namespace}: nothing in doubt")
    oldest = ""
    if summary.oldest_in_doubt is not None:
        seconds = (store.clock() - summary.oldest_in_doubt).total_seconds()
        oldest = f", the oldest for {seconds / 60:.0f} min"
    return Finding(
        "in doubt",
        Level.WARN,
        f"namespace {store.namespace}: {summary.in_doubt} record(s) in doubt{oldest}",
        f"effectq list --namespace {store.namespace}, then effectq resolve each one",
    )


def diagnose(
    store: Any, checks: tuple[Check, ...] = CHECKS, *, wait_replicas: int | None = None
) -> list[Finding]:
    """Every check on every node behind ``store``'s client, then what is in doubt in its namespace.

    ``wait_replicas``: what the application's stores wait for, when it is not
    ``store``'s own (the command line builds a store of its own).
    """
    wait = getattr(store, "wait_replicas", 0) if wait_replicas is None else wait_replicas
    found = [finding for node in nodes(store.client, wait_replicas=wait) for finding in examine(node, checks)]
    try:
        found.append(check_in_doubt(store))
    except Exception as exc:
        found.append(Finding("in doubt", Level.SKIP, f"could not read the indexes: {exc}"))
    return found
