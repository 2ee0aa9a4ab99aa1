"""An attempts cap: past ``max_attempts`` executions of one key it is parked as failed and every
call raises AttemptsExhausted, until an operator resets it; on every store alike."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import effectq
from effectq.errors import AttemptsExhausted
from effectq.ops import admin
from effectq.store.base import Status
from effectq.store.operators import Standing


class Declined(Exception):
    """A "not applied" failure: released, and tried again by the next call."""


def _run() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def _key(store: effectq.Store, run: str, effect: Any, *args: Any) -> str:
    with effectq.run(run, store=store):
        return str(effect.key(*args))


def test_releases_count_and_the_key_is_parked_after_max_attempts(store: effectq.Store) -> None:
    """Three releases, then the fourth call raises AttemptsExhausted, naming the key and the
    reset, without running; the record is FAILED with the last error."""
    calls: list[int] = []

    @effectq.effect(name="mail.send")
    def send(n: int) -> None:
        calls.append(n)
        raise Declined(f"relay refused #{len(calls)}")

    run = _run()
    for _ in range(3):
        with effectq.run(run, store=store), pytest.raises(Declined):
            send(1)
    for _ in range(2):
        with effectq.run(run, store=store), pytest.raises(AttemptsExhausted) as parked:
            send(1)
    key = _key(store, run, send, 1)
    assert calls == [1, 1, 1]
    assert (parked.value.key, parked.value.attempts) == (key, 3)
    assert "relay refused #3" in parked.value.last_error
    assert f"effectq resolve --namespace {store.namespace} '{key}' --not-applied" in str(parked.value)
    record = store.get(key)
    assert record is not None
    assert (record.status, record.attempt, record.failure) == (Status.FAILED, 3, "")
    assert "relay refused #3" in record.error and record.expires_at is not None


def test_resolving_not_applied_resets_the_attempts(store: effectq.Store) -> None:
    calls: list[int] = []

    @effectq.effect(name="mail.once", max_attempts=1)
    def send(n: int) -> str:
        calls.append(n)
        if len(calls) == 1:
            raise Declined("down")
        return "sent"

    run = _run()
    with effectq.run(run, store=store), pytest.raises(Declined):
        send(2)
    with effectq.run(run, store=store), pytest.raises(AttemptsExhausted):
        send(2)
    store.resolve(_key(store, run, send, 2), applied=False, note="relay fixed", retention_ms=60_000)
    with effectq.run(run, store=store):
        assert send(2) == "sent"
    assert calls == [2, 2]


def test_replay_safe_re_runs_of_an_unknown_count(store: effectq.Store) -> None:
    """Each replay-safe re-run of a maybe-applied outcome is an execution."""
    calls: list[int] = []

    @effectq.effect(name="mail.timeout", replay_safe=True, max_attempts=2)
    def send(n: int) -> None:
        calls.append(n)
        raise TimeoutError("the relay did not answer")

    run = _run()
    for _ in range(2):
        with effectq.run(run, store=store), pytest.raises(TimeoutError):
            send(3)
    with effectq.run(run, store=store), pytest.raises(AttemptsExhausted, match="did not answer"):
        send(3)
    assert calls == [3, 3]
    record = store.get(_key(store, run, send, 3))
    assert record is not None and record.status is Status.FAILED


def test_reconciled_not_applied_re_runs_count(store: effectq.Store) -> None:
    """A reconcile that finds nothing, then a re-run: counted; past the cap the dispatch parks the
    key instead of running it (the reconcile is still asked: it may find the effect applied)."""
    calls: list[int] = []
    asked: list[str] = []

    def nothing_found(key: str, args: dict[str, Any], ctx: Any) -> None:
        asked.append(key)
        return None

    @effectq.effect(name="mail.reconciled", reconcile=nothing_found, max_attempts=2)
    def send(n: int) -> None:
        calls.append(n)
        raise TimeoutError("no answer")

    run = _run()
    with effectq.run(run, store=store), pytest.raises(TimeoutError):
        send(4)
    with effectq.run(run, store=store), pytest.raises(TimeoutError):
        send(4)  # reconciled: not applied, so run again
    with effectq.run(run, store=store), pytest.raises(AttemptsExhausted):
        send(4)
    with effectq.run(run, store=store), pytest.raises(AttemptsExhausted):
        send(4)  # parked: no reconcile, no run
    assert (calls, len(asked)) == ([4, 4], 2)


def test_a_completed_effect_is_never_parked(store: effectq.Store) -> None:
    """The cap counts executions that did not complete: a completed key replays."""
    calls: list[int] = []

    @effectq.effect(name="mail.flaky", max_attempts=2)
    def send(n: int) -> str:
        calls.append(n)
        if len(calls) < 2:
            raise Declined("busy")
        return "sent"

    run = _run()
    with effectq.run(run, store=store), pytest.raises(Declined):
        send(5)
    for _ in range(3):
        with effectq.run(run, store=store):
            assert send(5) == "sent"
    assert calls == [5, 5]


def test_effectq_list_shows_parked_keys(store: effectq.Store) -> None:
    """``effectq list --status failed``: the parked key and its last error."""
    if not isinstance(store, admin.OperatorStore):
        pytest.skip("not an operator store")

    @effectq.effect(name="mail.listed", max_attempts=1)
    def send(n: int) -> None:
        raise Declined("bounced")

    run = _run()
    with effectq.run(run, store=store), pytest.raises(Declined):
        send(6)
    with effectq.run(run, store=store), pytest.raises(AttemptsExhausted):
        send(6)
    listed = list(admin.list_records(store, standings={Standing.FAILED}))
    assert [(e.record.key, e.standing) for e in listed] == [(_key(store, run, send, 6), Standing.FAILED)]
    assert "bounced" in listed[0].record.error
