"""effectq.celery on Celery's eager path: run binding, business keys, whole-task effects, outcomes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Retry

import effectq
import effectq.celery
from effectq.integration import StoreSource
from effectq.store.base import ClaimRequest


@pytest.fixture
def app() -> Iterator[Celery]:
    made = Celery("t", broker="memory://", backend="cache+memory://", set_as_current=False)
    made.conf.update(task_always_eager=True, task_store_eager_result=True)
    yield made
    installation = getattr(made, "effectq_installation", None)
    if installation is not None:
        installation.uninstall()


@pytest.fixture
def calls() -> list[Any]:
    return []


@pytest.fixture
def charge(calls: list[Any]) -> effectq.Effect[[int], int]:
    @effectq.effect(name="charge")
    def charge(amount: int) -> int:
        calls.append(amount)
        return amount * 10

    return charge


def test_run_is_the_task_id(app: Celery, store: effectq.Store, charge: Any, calls: list[Any]) -> None:
    """Two deliveries of one task id apply the effect once; the second replays it."""
    effectq.celery.install(app, store)
    seen: list[str] = []

    @app.task(shared=False, bind=True)
    def fulfil(self: Any, amount: int) -> int:
        seen.append(effectq.current_run().id)
        return charge(amount)

    app.finalize()
    assert fulfil.apply(args=(3,), task_id="task-1").get() == 30
    assert fulfil.apply(args=(3,), task_id="task-1").get() == 30
    assert fulfil.apply(args=(3,), task_id="task-2").get() == 30
    assert calls == [3, 3]
    assert seen == ["task-1", "task-1", "task-2"]
    assert effectq.active_run() is None


def test_the_end_of_a_run_is_logged(
    app: Celery, store: effectq.Store, charge: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """effectq.delivery logs a task's run at its end: at DEBUG what executed, at INFO what a
    retry or redelivery short-circuited, naming the task, its id and the run."""
    effectq.celery.install(app, store)

    @app.task(shared=False, name="shop.fulfil")
    def fulfil(amount: int) -> int:
        return charge(amount)

    app.finalize()
    with caplog.at_level("DEBUG", logger="effectq.delivery"):
        fulfil.apply(args=(3,), task_id="task-l")
    assert [r.getMessage() for r in caplog.records] == [
        "effectq task shop.fulfil[task-l] (run task-l): 1 executed, 0 failed"
    ]
    caplog.clear()
    with caplog.at_level("INFO", logger="effectq.delivery"):
        fulfil.apply(args=(3,), task_id="task-l")  # no DEBUG line: only the replay's INFO one
        fulfil.apply(args=(3,), task_id="task-l", retries=1)
    assert [r.getMessage() for r in caplog.records] == [
        "effectq task shop.fulfil[task-l] (run task-l) short-circuited 1 effect(s): "
        "1 replayed, 0 reconciled, 0 executed",
        "effectq task shop.fulfil[task-l] (run task-l) was delivered again and short-circuited "
        "1 effect(s): 1 replayed, 0 reconciled, 0 executed",
    ]


def test_business_key_template(app: Celery, store: effectq.Store, charge: Any, calls: list[Any]) -> None:
    """effectq_run_id names the run by a business key: two task ids of one order apply once."""
    effectq.celery.install(app, store)

    @app.task(shared=False, effectq_run_id="order:{order_id}")
    def fulfil(order_id: int, amount: int = 5) -> str:
        charge(amount)
        return effectq.current_run().id

    assert fulfil.apply(args=(42,)).get() == "order:42"
    assert fulfil.apply(kwargs={"order_id": 42}).get() == "order:42"
    assert calls == [5]


def test_business_key_function(app: Celery, store: effectq.Store) -> None:
    """effectq_run_id may be a function of the task's arguments."""
    effectq.celery.install(app, store)

    @app.task(shared=False, effectq_run_id=lambda order, **_: f"order:{order['id']}")
    def fulfil(order: dict[str, int]) -> str:
        return effectq.current_run().id

    assert fulfil.apply(args=({"id": 7},)).get() == "order:7"


def test_bad_business_key_binds_nothing(
    app: Celery, store: effectq.Store, charge: Any, calls: list[Any]
) -> None:
    """A template naming an argument the task lacks binds no run: the effect does not run."""
    effectq.celery.install(app, store)

    @app.task(shared=False, effectq_run_id="order:{missing}")
    def fulfil(order_id: int) -> int:
        return charge(order_id)

    result = fulfil.apply(args=(1,))
    assert isinstance(result.result, effectq.NoActiveRun)
    assert calls == []


def test_whole_task_effect_returns_recorded_value(app: Celery, store: effectq.Store) -> None:
    """effectq_task=True: a second delivery of a completed task returns its value; the body does not run."""
    effectq.celery.install(app, store)
    bodies: list[int] = []

    @app.task(shared=False, bind=True, effectq_task=True)
    def quote(self: Any, n: int) -> dict[str, int]:
        bodies.append(n)
        return {"n": n, "body": len(bodies)}

    app.finalize()
    assert quote.apply(args=(1,), task_id="q").get() == {"n": 1, "body": 1}
    assert quote.apply(args=(1,), task_id="q").get() == {"n": 1, "body": 1}
    assert bodies == [1]


def test_runs_do_not_leak_between_nested_tasks(app: Celery, store: effectq.Store) -> None:
    """A task applied inside another gets its own run; the outer run is bound again after it."""
    effectq.celery.install(app, store)

    @app.task(shared=False)
    def inner() -> str:
        return effectq.current_run().id

    @app.task(shared=False, bind=True)
    def outer(self: Any) -> list[str]:
        before = effectq.current_run().id
        nested = inner.apply(task_id="inner-1").get()
        return [before, nested, effectq.current_run().id]

    assert outer.apply(task_id="outer-1").get() == ["outer-1", "inner-1", "outer-1"]
    assert effectq.active_run() is None


def test_in_progress_becomes_a_retry_with_countdown(
    app: Celery, store: effectq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same effect in flight elsewhere: the task is retried after the countdown, not failed."""
    effectq.celery.install(app, store, in_progress_countdown=7)

    @effectq.effect(name="slow", wait=0.05)
    def slow() -> None:
        raise AssertionError("must not run while another holder has it")

    @app.task(shared=False, bind=True, max_retries=0)
    def job(self: Any) -> None:
        slow()

    app.finalize()
    with effectq.run("job-1", store=store):
        key = slow.key()
    store.claim(key, ClaimRequest(lease_ms=60_000, owner="elsewhere"))
    asked: list[dict[str, Any]] = []

    def fake_retry(**kwargs: Any) -> Retry:
        asked.append(kwargs)
        return Retry("retry", exc=kwargs.get("exc"))

    monkeypatch.setattr(job, "retry", fake_retry)
    result = job.apply(task_id="job-1")
    assert result.state == "RETRY"
    assert asked[0]["countdown"] == 7
    assert asked[0]["max_retries"] == 1  # an in-flight retry does not use up max_retries
    assert isinstance(asked[0]["exc"], effectq.InProgress)


def test_outcome_unknown_fails_once_without_retry(app: Celery, store: effectq.Store) -> None:
    """OutcomeUnknown fails the task (FAILURE, the OutcomeUnknown stored) and autoretry does not loop."""
    effectq.celery.install(app, store)
    bodies: list[int] = []

    @effectq.effect(name="wire")
    def wire() -> None:
        raise TimeoutError("the bank did not answer")

    @app.task(shared=False, bind=True, autoretry_for=(Exception,), max_retries=5, default_retry_delay=0)
    def pay(self: Any) -> None:
        bodies.append(1)
        wire()

    app.finalize()
    result = pay.apply(task_id="pay-1")
    # The timeout recorded the effect as unknown; autoretry's retry met that and stopped for good.
    assert bodies == [1, 1]
    assert result.state == "IGNORED"
    assert app.backend.get_state("pay-1") == "FAILURE"
    stored = app.backend.get_result("pay-1")
    assert isinstance(stored, effectq.OutcomeUnknown)
    assert stored.key.startswith("pay-1:wire:")


def test_self_retry_replays_the_effect(
    app: Celery, store: effectq.Store, charge: Any, calls: list[Any]
) -> None:
    """self.retry() after one effect: the retry (same task id) replays it instead of repeating it."""
    effectq.celery.install(app, store)

    @app.task(shared=False, bind=True, default_retry_delay=0)
    def job(self: Any) -> int:
        charge(1)
        if self.request.retries == 0:
            raise self.retry()
        return charge(2)

    app.finalize()
    job.apply(task_id="job-r")
    assert calls == [1, 2]


def test_check_reports_unsafe_configuration() -> None:
    """check() names early acks, lost workers, a short visibility timeout and retries beyond retention."""
    app = Celery("c", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    app.conf.broker_transport_options = {"visibility_timeout": 30}

    @app.task(shared=False, max_retries=None)
    def forever() -> None: ...

    @app.task(shared=False, acks_late=True)
    def late() -> None: ...

    problems = " ".join(effectq.celery.check(app, lease=60))
    for phrase in ("task_acks_late is off", "task_reject_on_worker_lost is off", "visibility_timeout=30s",
                   "longer than visibility_timeout", "retention"):  # fmt: skip
        assert phrase in problems


def test_check_accepts_a_safe_configuration() -> None:
    """A configuration that gives the guarantee draws no warning."""
    app = Celery("c", broker="redis://127.0.0.1:6379/0", set_as_current=False)
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True, task_time_limit=600)

    @app.task(shared=False, max_retries=3, default_retry_delay=60)
    def fine() -> None: ...

    assert effectq.celery.check(app) == []


def test_install_twice_is_refused(app: Celery, store: effectq.Store) -> None:
    """A second install on one app would bind two runs per task: refused."""
    effectq.celery.install(app, store)
    with pytest.raises(effectq.ConfigurationError):
        effectq.celery.install(app, store)


def _child_store(source: StoreSource, parent_id: int, out: Any) -> None:
    store = source.get()
    out.put((id(store) != parent_id, type(store).__name__, store.namespace))


def test_store_url_gives_each_forked_process_its_own_store(redis_url: str, namespace: str) -> None:
    """From a URL, a forked child (a prefork pool process) builds its own store and connection."""
    source = StoreSource(redis_url, namespace=namespace)
    parent = source.get()
    assert source.get() is parent
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_store, args=(source, id(parent), out))
    child.start()
    child.join(30)
    assert out.get(timeout=5) == (True, "RedisStore", namespace)


@pytest.mark.parametrize("signal_name", ["worker_shutdown", "worker_process_shutdown"])
def test_a_worker_shutting_down_tries_pending_writes_once_more(
    app: Celery, redis_store: effectq.RedisStore, caplog: pytest.LogCaptureFixture, signal_name: str
) -> None:
    """A prefork child ends without atexit: Celery's shutdown signals (the main process's and each
    child's) try the writes the heartbeat still retries, and log each that does not land."""
    from celery import signals

    from effectq._runtime.leases import heartbeat

    effectq.celery.install(app, redis_store)

    def down() -> None:
        raise ConnectionError("Redis is still down")

    heartbeat.defer(down, "complete of r:send:1", store=redis_store, advice="Settle it with effectq resolve.")
    with caplog.at_level("ERROR", logger="effectq.repair"):
        getattr(signals, signal_name).send(sender=None, pid=0, exitcode=0)
    assert heartbeat.pending()[1] == 0
    assert "complete of r:send:1 never landed before the worker shut down" in caplog.text
    assert "Settle it with effectq resolve." in caplog.text


def test_a_task_sees_how_each_effect_came(
    app: Celery, store: effectq.Store, charge: Any, calls: list[Any]
) -> None:
    """Inside a task, call_with_outcome says executed, then replayed on the redelivery of its id."""
    effectq.celery.install(app, store)

    @app.task(shared=False)
    def fulfil(amount: int) -> list[Any]:
        done = charge.call_with_outcome(amount)
        return [done.value, done.kind.value, done.key, done.idempotency_key]

    app.finalize()
    first = fulfil.apply(args=(2,), task_id="task-o").get()
    again = fulfil.apply(args=(2,), task_id="task-o").get()
    assert calls == [2]
    assert first[:2] == [20, "executed"]
    assert again[:2] == [20, "replayed"]
    assert first[2:] == again[2:]
    assert first[2].startswith("task-o:charge:")


class _Declined(Exception):
    """Not applied: released, so the next attempt runs the effect again."""


def _parked_by_attempts() -> effectq.Effect[[], None]:
    @effectq.effect(name="wire", max_attempts=1)
    def wire() -> None:
        raise _Declined("the bank refused")

    return wire


def _parked_by_a_terminal_failure() -> effectq.Effect[[], None]:
    class Fraud(Exception):  # defined here, so it does not import: raised again as RecordedFailure
        pass

    @effectq.effect(name="wire", terminal=Fraud)
    def wire() -> None:
        raise Fraud("card reported stolen")

    return wire


@pytest.mark.parametrize(
    ("make", "stopped_by"),
    [
        (_parked_by_attempts, effectq.AttemptsExhausted),
        (_parked_by_a_terminal_failure, effectq.RecordedFailure),
    ],
    ids=["attempts-exhausted", "recorded-failure"],
)
def test_a_parked_key_fails_the_task_once_without_retry(
    redis_url: str, redis_store: effectq.RedisStore, make: Any, stopped_by: type[effectq.EffectqError]
) -> None:
    """A key that only raises again (parked after its attempts, or a recorded terminal failure)
    fails the task, not retried by autoretry; the caller gets the error, naming the key and the
    reset, from the JSON result backend."""
    app = Celery("parked", broker="memory://", backend=redis_url, set_as_current=False)
    app.conf.update(task_always_eager=True, task_store_eager_result=True, result_serializer="json")
    effectq.celery.install(app, redis_store)
    wire = make()
    bodies: list[int] = []

    @app.task(shared=False, bind=True, autoretry_for=(Exception,), max_retries=5, default_retry_delay=0)
    def pay(self: Any) -> None:
        bodies.append(1)
        wire()

    app.finalize()
    task_id = f"parked-{redis_store.namespace}"
    try:
        result = pay.apply(task_id=task_id)
        # The first body's failure parked the key; autoretry's retry met it and stopped for good.
        assert bodies == [1, 1]
        assert result.state == "IGNORED"
        caller = Celery("caller", backend=redis_url, set_as_current=False)  # another process's view
        caller.conf.update(result_serializer="json", accept_content=["json"])
        assert caller.AsyncResult(task_id).state == "FAILURE"
        with pytest.raises(stopped_by) as raised:
            caller.AsyncResult(task_id).get(timeout=5)
        assert raised.value.key.startswith(f"{task_id}:wire:")  # type: ignore[attr-defined]
        assert (
            f"effectq resolve --namespace {redis_store.namespace} '{raised.value.key}' --not-applied"
            in str(  # type: ignore[attr-defined]
                raised.value
            )
        )
    finally:
        app.backend.forget(task_id)
        app.effectq_installation.uninstall()  # type: ignore[attr-defined]
