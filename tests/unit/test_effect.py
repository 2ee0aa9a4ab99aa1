"""The effect engine, on every store: apply once, replay typed results, release, unknown, reconcile."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
import uuid
from typing import Any

import pydantic
import pytest

import effectq
from effectq import events


class Receipt(pydantic.BaseModel):
    id: str
    sent_at: dt.datetime


@dataclasses.dataclass
class Charge:
    amount: int
    currency: str


class Ledger:
    """Plays the remote system: records every application."""

    def __init__(self) -> None:
        self.applied: list[Any] = []
        self.lock = threading.Lock()

    def apply(self, item: Any) -> int:
        with self.lock:
            self.applied.append(item)
            return len(self.applied)


@pytest.fixture
def ledger() -> Ledger:
    return Ledger()


def run_id() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def test_applies_once_per_key_and_replays(store: effectq.Store, ledger: Ledger) -> None:
    """The same call twice in a run applies once; other input applies again."""

    @effectq.effect(name="mail.send")
    def send(to: str, subject: str) -> int:
        return ledger.apply((to, subject))

    with effectq.run(run_id(), store=store) as bound:
        assert send("a@x", "hi") == 1
        assert send("a@x", "hi") == 1
        assert send(subject="hi", to="a@x") == 1
        assert send("b@x", "hi") == 2
    assert ledger.applied == [("a@x", "hi"), ("b@x", "hi")]
    assert (bound.stats.executed, bound.stats.replayed) == (2, 2)


def test_a_redelivery_in_a_new_run_binding_replays(store: effectq.Store, ledger: Ledger) -> None:
    """A second delivery of the same task (same run id) does not repeat the effect."""

    @effectq.effect
    def charge(order: int) -> int:
        return ledger.apply(order)

    rid = run_id()
    with effectq.run(rid, store=store):
        charge(7)
    with effectq.run(rid, store=store) as second:
        assert charge(7) == 1
    assert ledger.applied == [7]
    assert second.stats.replayed == 1


def test_replay_returns_the_declared_type(store: effectq.Store) -> None:
    """A model stays a model, a dataclass a dataclass, a datetime a datetime."""
    when = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)

    @effectq.effect
    def receipt(n: int) -> Receipt:
        return Receipt(id=f"r{n}", sent_at=when)

    @effectq.effect
    def charge(n: int) -> Charge:
        return Charge(n, "EUR")

    @effectq.effect
    def stamp() -> dt.datetime:
        return when

    rid = run_id()
    with effectq.run(rid, store=store):
        first = (receipt(1), charge(2), stamp())
    with effectq.run(rid, store=store):
        again = (receipt(1), charge(2), stamp())
    assert again == first
    assert (
        isinstance(again[0], Receipt) and isinstance(again[1], Charge) and isinstance(again[2], dt.datetime)
    )


def test_no_run_bound_runs_nothing(ledger: Ledger) -> None:
    """Outside a run the call fails with NoActiveRun and the function does not run."""

    @effectq.effect
    def send() -> None:
        ledger.apply("x")

    with pytest.raises(effectq.NoActiveRun):
        send()
    assert ledger.applied == []


def test_exception_releases_and_next_call_applies(store: effectq.Store, ledger: Ledger) -> None:
    """An ordinary exception means "not applied": the next call runs the function again."""
    attempts: list[int] = []

    @effectq.effect
    def flaky(n: int) -> int:
        attempts.append(effectq.current_effect().attempt)
        if len(attempts) == 1:
            raise ValueError("rejected by the API")
        return ledger.apply(n)

    rid = run_id()
    with effectq.run(rid, store=store):
        with pytest.raises(ValueError, match="rejected"):
            flaky(1)
        assert flaky(1) == 1
        assert flaky(1) == 1
    assert attempts == [1, 2]
    assert ledger.applied == [1]


def test_maybe_applied_exception_becomes_unknown(store: effectq.Store, ledger: Ledger) -> None:
    """A timeout may mean the effect applied: recorded unknown, never run again silently."""

    @effectq.effect(name="pay.charge")
    def charge(n: int) -> int:
        ledger.apply(n)
        raise TimeoutError("read timed out")

    rid = run_id()
    with effectq.run(rid, store=store):
        with pytest.raises(TimeoutError):
            charge(1)
        with pytest.raises(effectq.OutcomeUnknown) as info:
            charge(1)
    assert ledger.applied == [1]
    assert info.value.name == "pay.charge"
    assert "TimeoutError" in info.value.reason
    assert "effectq resolve" in str(info.value)
    record = store.get(info.value.key)
    assert record is not None and record.status is effectq.Status.UNKNOWN


def test_maybe_applied_is_configurable(store: effectq.Store) -> None:
    """A custom classifier decides which exceptions mean "maybe applied"."""

    class Ambiguous(Exception):
        pass

    @effectq.effect(maybe_applied=[Ambiguous])
    def call(kind: str) -> None:
        raise Ambiguous() if kind == "a" else TimeoutError()

    with effectq.run(run_id(), store=store):
        with pytest.raises(Ambiguous):
            call("a")
        with pytest.raises(effectq.OutcomeUnknown):
            call("a")
        with pytest.raises(TimeoutError):
            call("t")
        with pytest.raises(TimeoutError):  # released: not in the configured set
            call("t")


def test_reconcile_finds_an_unknown_effect(store: effectq.Store, ledger: Ledger) -> None:
    """After an unknown outcome, reconcile asks the remote side; found means recorded and returned."""
    remote: dict[str, int] = {}

    def find(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> int | None:
        assert args == {"n": 5}
        assert ctx.key == key
        return remote.get(key)

    @effectq.effect(reconcile=find)
    def post(n: int) -> int:
        remote[effectq.current_effect().key] = ledger.apply(n)
        raise TimeoutError()

    with effectq.run(run_id(), store=store) as bound:
        with pytest.raises(TimeoutError):
            post(5)
        assert post(5) == 1
        assert post(5) == 1
    assert ledger.applied == [5]
    assert bound.stats.reconciled == 1


def test_reconcile_not_found_executes(store: effectq.Store, ledger: Ledger) -> None:
    """Reconcile returning None means "not applied": the caller executes, once."""
    first = True

    @effectq.effect(reconcile=lambda key, args, ctx: None)
    def post(n: int) -> int:
        nonlocal first
        if first:
            first = False
            raise TimeoutError()
        return ledger.apply(n)

    with effectq.run(run_id(), store=store):
        with pytest.raises(TimeoutError):
            post(1)
        assert post(1) == 1
        assert post(1) == 1
    assert ledger.applied == [1]


def test_reconcile_raising_stays_unknown(store: effectq.Store) -> None:
    """A reconcile hook that raises leaves the outcome unknown, and says why."""

    def broken(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> Any:
        raise ConnectionError("CRM down")

    @effectq.effect(reconcile=broken)
    def post() -> None:
        raise TimeoutError()

    with effectq.run(run_id(), store=store):
        with pytest.raises(TimeoutError):
            post()
        with pytest.raises(effectq.OutcomeUnknown, match="CRM down"):
            post()
        with pytest.raises(effectq.OutcomeUnknown):
            post()


def test_reconcile_applied_none_result(store: effectq.Store) -> None:
    """For an effect whose result is None, Applied() says "found"."""
    ran: list[int] = []

    @effectq.effect(reconcile=lambda key, args, ctx: effectq.Applied())
    def notify() -> None:
        ran.append(1)
        raise TimeoutError()

    with effectq.run(run_id(), store=store):
        with pytest.raises(TimeoutError):
            notify()
        assert notify() is None
        assert notify() is None
    assert ran == [1]


def test_reconcile_always_reads_before_writing(store: effectq.Store, ledger: Ledger) -> None:
    """reconcile_on="always" asks before the first execution too."""
    remote = {"exists": 41}
    asked: list[str] = []

    def find(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> int | None:
        asked.append(args["what"])
        return remote.get(args["what"])

    @effectq.effect(reconcile=find, reconcile_on="always")
    def create(what: str) -> int:
        return ledger.apply(what)

    with effectq.run(run_id(), store=store):
        assert create("exists") == 41
        assert create("new") == 1
        assert create("new") == 1
    assert ledger.applied == ["new"]
    assert asked == ["exists", "new"]


def test_replay_safe_reexecutes_unknown_with_the_same_idempotency_key(store: effectq.Store) -> None:
    """replay_safe: the remote side dedupes by our key, so an unknown may run again."""
    keys: list[str] = []

    @effectq.effect(replay_safe=True)
    def push() -> str:
        keys.append(effectq.current_effect().idempotency_key)
        if len(keys) == 1:
            raise TimeoutError()
        return "ok"

    with effectq.run(run_id(), store=store):
        with pytest.raises(TimeoutError):
            push()
        assert push() == "ok"
    assert len(keys) == 2 and keys[0] == keys[1]


def test_key_function_and_mismatch(
    store: effectq.Store, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """A key function decides identity; same key, other input warns and replays."""

    @effectq.effect(key=lambda args, ctx: f"{ctx.run_id}:comment:{args['issue']}")
    def comment(issue: int, body: str) -> int:
        return ledger.apply(body)

    with effectq.run(run_id(), store=store):
        assert comment(1, "first") == 1
        with caplog.at_level(logging.WARNING, logger="effectq.replay"):
            assert comment(1, "second") == 1
    assert ledger.applied == ["first"]
    assert "different input" in caplog.text


def test_mismatch_can_raise(store: effectq.Store) -> None:
    """on_mismatch="raise" turns a different input under the same key into an error."""

    @effectq.effect(key=lambda args, ctx: "fixed", on_mismatch="raise")
    def act(body: str) -> str:
        return body

    with effectq.run(run_id(), store=store):
        act("a")
        with pytest.raises(effectq.InputMismatchError):
            act("b")


def test_ordinal_counts_calls_for_step_keys(store: effectq.Store, ledger: Ledger) -> None:
    """ctx.ordinal numbers the calls of one effect in a run, for keys that count steps."""

    @effectq.effect(key=lambda args, ctx: f"{ctx.run_id}:step:{ctx.ordinal}")
    def step(text: str) -> int:
        return ledger.apply(text)

    rid = run_id()
    with effectq.run(rid, store=store):
        assert [step("a"), step("b")] == [1, 2]
    with effectq.run(rid, store=store):  # redelivered: the model wrote other text, same steps
        assert [step("a2"), step("b2")] == [1, 2]
    assert ledger.applied == ["a", "b"]


def test_key_args_leave_clients_out_of_the_key(store: effectq.Store, ledger: Ledger) -> None:
    """An argument with no canonical form (a client) can be left out of the key."""

    class Client:
        pass

    @effectq.effect(key_args=["to"])
    def send(client: Client, to: str) -> int:
        return ledger.apply(to)

    with effectq.run(run_id(), store=store):
        assert send(Client(), "a") == send(Client(), "a") == 1


def test_bad_input_fails_before_anything(store: effectq.Store, ledger: Ledger) -> None:
    """Input that cannot be keyed raises, naming the argument, and nothing is claimed."""

    @effectq.effect
    def send(to: Any) -> None:
        ledger.apply(to)

    with effectq.run(run_id(), store=store):
        with pytest.raises(effectq.InvalidInputError, match="'to'"):
            send(object())
        with pytest.raises(TypeError):
            send()  # type: ignore[call-arg]
    assert ledger.applied == []


def test_bad_key_fails_before_anything(store: effectq.Store, ledger: Ledger) -> None:
    """A key function returning a non-string or empty key raises before anything runs."""

    @effectq.effect(key=lambda args, ctx: args["k"])
    def act(k: Any) -> None:
        ledger.apply(k)

    with effectq.run(run_id(), store=store):
        for bad in (None, "", 3):
            with pytest.raises(effectq.InvalidKeyError):
                act(bad)
    assert ledger.applied == []


def test_current_effect_describes_the_call(store: effectq.Store) -> None:
    """Inside an effect: key, idempotency key, run id, name, attempt, marker."""
    seen: list[effectq.EffectContext] = []

    @effectq.effect(name="gh.comment")
    def comment(body: str) -> str:
        ctx = effectq.current_effect()
        seen.append(ctx)
        return f"{body}\n{ctx.marker}"

    rid = run_id()
    with effectq.run(rid, store=store):
        text = comment("hello")
    ctx = seen[0]
    assert ctx.run_id == rid and ctx.name == "gh.comment" and ctx.attempt == 1
    assert ctx.key.startswith(f"{rid}:gh.comment:")
    assert ctx.idempotency_key == effectq.idempotency_key(store.namespace, ctx.key)
    assert list(effectq.find_markers(text)) == [ctx.key]
    with pytest.raises(effectq.NoActiveEffect):
        effectq.current_effect()


def test_result_too_large_is_applied_without_result(store: effectq.Store, ledger: Ledger) -> None:
    """A result over the bound is recorded as applied; a replay says so instead of re-running."""

    @effectq.effect(max_result_bytes=100)
    def export() -> str:
        ledger.apply(1)
        return "x" * 1000

    with effectq.run(run_id(), store=store):
        assert len(export()) == 1000
        with pytest.raises(effectq.ResultNotRecordedError, match="too_large"):
            export()
    assert ledger.applied == [1]


def test_unannotated_results_replay_as_json(store: effectq.Store) -> None:
    """Without an annotation a result is plain JSON."""

    @effectq.effect
    def act():  # type: ignore[no-untyped-def]
        return {"ids": (1, 2)}

    rid = run_id()
    with effectq.run(rid, store=store):
        act()
    with effectq.run(rid, store=store):
        assert act() == {"ids": [1, 2]}


class Opaque:
    """A type pydantic has no schema for."""


def test_unrecordable_return_type_fails_before_running(store: effectq.Store, ledger: Ledger) -> None:
    """A return annotation pydantic cannot serialise is a clear error before any side effect."""

    @effectq.effect
    def act() -> Opaque:
        ledger.apply(1)
        return Opaque()

    with (
        effectq.run(run_id(), store=store),
        pytest.raises(effectq.ConfigurationError, match="cannot be recorded"),
    ):
        act()
    assert ledger.applied == []


def test_namespaces_isolate_tenants(ledger: Ledger, namespace: str) -> None:
    """The same run and call in two namespaces are two effects."""
    a, b = effectq.MemoryStore(namespace="tenant-a"), effectq.MemoryStore(namespace="tenant-b")

    @effectq.effect
    def act() -> int:
        return ledger.apply(1)

    for store in (a, b):
        with effectq.run("same-run", store=store):
            act()
    assert len(ledger.applied) == 2


def test_methods_key_without_self(store: effectq.Store, ledger: Ledger) -> None:
    """An effect on a method is keyed by its arguments, not by the instance."""

    class Mailer:
        @effectq.effect(name="mailer.send")
        def send(self, to: str) -> int:
            return ledger.apply(to)

    with effectq.run(run_id(), store=store):
        assert Mailer().send("a") == Mailer().send("a") == 1


def test_threads_share_one_execution(store: effectq.Store, ledger: Ledger) -> None:
    """Eight threads calling the same effect at once: one execution, one result for all."""
    rid = run_id()
    gate = threading.Barrier(8)

    @effectq.effect
    def slow(n: int) -> int:
        time.sleep(0.3)
        return ledger.apply(n)

    results: list[int] = []

    def worker() -> None:
        with effectq.run(rid, store=store):
            gate.wait()
            results.append(slow(1))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [1] * 8
    assert ledger.applied == [1]


def test_in_flight_elsewhere_waits_then_in_progress(store: effectq.Store) -> None:
    """A live claim held by someone else: wait up to `wait`, then InProgress."""
    rid = run_id()

    @effectq.effect(name="slow.job", wait=0.3)
    def job() -> None:
        pass

    with effectq.run(rid, store=store):
        key = job.key()
    store.claim(key, effectq.store.ClaimRequest(lease_ms=10_000, owner="other-process"))
    with effectq.run(rid, store=store), pytest.raises(effectq.InProgress) as info:
        job()
    assert info.value.owner == "other-process"
    assert info.value.waited >= 0.3


def test_waiter_gets_the_result_when_holder_completes(store: effectq.Store) -> None:
    """A waiter wakes when the holder elsewhere completes, and returns its result."""
    rid = run_id()

    @effectq.effect(wait=10)
    def job() -> str:
        return "mine"

    with effectq.run(rid, store=store):
        key = job.key()
    claim = store.claim(key, effectq.store.ClaimRequest(lease_ms=10_000, owner="other"))

    def finish() -> None:
        time.sleep(0.3)
        store.complete(
            key, claim.token, result=b'"theirs"', result_state=effectq.ResultState.STORED, retention_ms=60_000
        )

    threading.Thread(target=finish).start()
    with effectq.run(rid, store=store) as bound:
        assert job() == "theirs"
    assert bound.stats.waited == 1


def test_events_report_each_phase(store: effectq.Store) -> None:
    """Listeners see claimed, executed, completed, then replayed, with timings."""
    seen: list[events.Event] = []
    unsubscribe = events.subscribe(seen.append)
    try:

        @effectq.effect(name="ev.act")
        def act() -> int:
            return 1

        with effectq.run(run_id(), store=store):
            act()
            act()
    finally:
        unsubscribe()
    kinds = [e.kind for e in seen if e.name == "ev.act"]
    assert kinds == ["claimed", "executed", "completed", "replayed"]
    assert all(e.duration >= 0 and e.started_ns > 0 for e in seen)


def test_a_failing_listener_changes_nothing(store: effectq.Store) -> None:
    """A listener that raises is logged; the effect behaves as without it."""

    def broken(event: events.Event) -> None:
        raise RuntimeError("metrics backend down")

    unsubscribe = events.subscribe(broken)
    try:

        @effectq.effect
        def act() -> int:
            return 1

        with effectq.run(run_id(), store=store):
            assert act() == 1
    finally:
        unsubscribe()


class CountingRedis:
    """Counts the commands a store sends (each a round trip: the store does not pipeline them)."""

    def __init__(self, url: str) -> None:
        import redis

        self.commands: list[str] = []
        outer = self

        class Client(redis.Redis):  # type: ignore[type-arg]
            def execute_command(self, *args: Any, **options: Any) -> Any:
                outer.commands.append(str(args[0]))
                return super().execute_command(*args, **options)

        self.client = Client.from_url(url)


def test_round_trips_first_time_two_replay_one(redis_url: str, namespace: str) -> None:
    """A first-time effect costs two round trips (claim, complete); replaying one costs one."""
    from tests.conftest import delete_namespace

    counting = CountingRedis(redis_url)
    store = effectq.RedisStore(counting.client, namespace=namespace)

    @effectq.effect
    def act(n: int) -> int:
        return n

    rid = run_id()
    try:
        with effectq.run(f"warm-{rid}", store=store):
            act(0)  # loads the scripts once per store (SCRIPT LOAD on the first EVALSHA miss)
        with effectq.run(rid, store=store):
            counting.commands.clear()
            act(1)
            first = list(counting.commands)
        with effectq.run(rid, store=store):  # a redelivery of a run with one effect
            counting.commands.clear()
            act(1)
            replay = list(counting.commands)
    finally:
        delete_namespace(counting.client, namespace)
    assert first == ["EVALSHA", "EVALSHA"]
    assert replay == ["EVALSHA"]


def test_redelivered_run_resumes_in_one_round_trip(redis_url: str, namespace: str) -> None:
    """A redelivered run with many completed effects: one claim, whose reply brings the rest, then none."""
    from tests.conftest import delete_namespace

    counting = CountingRedis(redis_url)
    store = effectq.RedisStore(counting.client, namespace=namespace)
    applied: list[int] = []

    @effectq.effect
    def act(n: int) -> int:
        applied.append(n)
        return n * 2

    rid = run_id()
    try:
        with effectq.run(rid, store=store):
            assert [act(n) for n in range(20)] == [n * 2 for n in range(20)]
        with effectq.run(rid, store=store) as again:
            counting.commands.clear()
            assert [act(n) for n in range(20)] == [n * 2 for n in range(20)]
            resumed = list(counting.commands)
            counting.commands.clear()
            act(99)  # a new effect after the resumed ones still applies
    finally:
        delete_namespace(counting.client, namespace)
    assert resumed == ["EVALSHA"]
    assert again.stats.replayed == 20
    assert applied == [*range(20), 99]


def test_holding_a_lease_does_not_wake_the_heartbeat_each_call(
    redis_store: effectq.RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short effect with the default lease takes its lease without waking the heartbeat thread.

    Waking it on every call handed the GIL to another thread twice per effect.
    """
    from effectq._runtime.leases import heartbeat

    @effectq.effect
    def act(n: int) -> int:
        return n

    with effectq.run(run_id(), store=redis_store):
        act(-1)  # the heartbeat thread started
        time.sleep(0.05)  # and went to sleep
        wakes: list[object] = []
        ring = heartbeat._ring
        monkeypatch.setattr(heartbeat, "_ring", lambda: (wakes.append(()), ring()))
        for n in range(300):
            act(n)
    assert len(wakes) <= 1  # at most the idle heartbeat's first look after a long sleep


def test_a_store_that_does_not_subclass_store_is_refused_before_any_side_effect(store: effectq.Store) -> None:
    """A store written against the protocol alone (forwarding the primitives) lacks the optional
    capabilities' defaults: binding a run with it fails at once with what to change, instead of
    the engine failing after the function ran."""

    class Forwarding:
        def __init__(self, inner: effectq.Store) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            if name in ("prefetch", "complete_pipelined", "flush_pending", "async_store"):
                raise AttributeError(name)
            return getattr(self._inner, name)

    calls: list[int] = []

    @effectq.effect(name="structural.send")
    def send(n: int) -> int:
        calls.append(n)
        return n

    run_id = f"structural-{uuid.uuid4().hex[:8]}"
    with (
        pytest.raises(effectq.ConfigurationError, match=r"does not subclass effectq\.Store"),
        effectq.run(run_id, store=Forwarding(store)),  # type: ignore[arg-type]
    ):
        send(1)
    assert calls == []
