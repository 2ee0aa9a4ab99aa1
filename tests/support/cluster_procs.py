"""Child processes for the Redis Cluster tests: ``python -m tests.support.cluster_procs SCENARIO ...``.

The effects run on the cluster; the remote system they apply to is played by the
ledger on the suite's single Redis (see :mod:`tests.support.procs`), so a test counts
applications on a server that no slot migration touches.
"""

from __future__ import annotations

import json
import os
import random
import sys

import effectq
from tests.support.procs import apply, remote, say


def _effect(ledger_client: object, ledger: str) -> effectq.Effect[[int, int], str]:
    @effectq.effect(name="cluster.apply", key=lambda a, ctx: f"{ctx.run_id}:{a['rnd']}:{a['n']}", wait=60)
    def act(rnd: int, n: int) -> str:
        return apply(ledger_client, ledger, f"{rnd}:{n}:{os.getpid()}")  # type: ignore[arg-type]

    return act


def race(cluster_url: str, ledger_url: str, namespace: str, run_id: str, ledger: str, keys: str) -> None:
    """Wait for the start signal, then call every key once in a shuffled order; print the results."""
    client = remote(ledger_url)
    store = effectq.RedisStore.from_url(cluster_url, namespace=namespace)
    act = _effect(client, ledger)
    order = list(range(int(keys)))
    random.shuffle(order)
    say("ready")
    client.blpop([f"{ledger}:go"], timeout=60)
    client.rpush(f"{ledger}:go", "go")  # pass the signal on to the next process
    with effectq.run(run_id, store=store):
        say(json.dumps({n: act(0, n) for n in order}))


def churn(
    cluster_url: str, ledger_url: str, namespace: str, run_id: str, ledger: str, keys: str, replicas: str
) -> None:
    """Round after round of fresh keys (shared by every churner) until told to stop.

    Prints one line: how many calls returned, and how many failed, by exception class.
    A failure is allowed (a claim that cannot be routed fails closed); a repeat is not,
    and the test counts repeats in the ledger. ``replicas``: the store's wait_replicas.
    """
    client = remote(ledger_url)
    store = effectq.RedisStore.from_url(cluster_url, namespace=namespace, wait_replicas=int(replicas))
    act = _effect(client, ledger)
    outcomes: dict[str, int] = {}
    rounds = 0
    say("ready")
    with effectq.run(run_id, store=store):
        while not client.exists(f"{ledger}:stop"):
            order = list(range(int(keys)))
            random.shuffle(order)
            for n in order:
                try:
                    act(rounds, n)
                    outcome = "ok"
                except effectq.EffectqError as exc:
                    outcome = type(exc).__name__
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
            rounds += 1
    say(json.dumps({"rounds": rounds, "outcomes": outcomes, "replicas": int(replicas)}))


SCENARIOS = {"race": race, "churn": churn}

if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
