"""effectq's exceptions travel: through pickle and through Celery's JSON result backend on Redis.

A task that meets OutcomeUnknown fails with it; the caller reads it back from
the result backend (JSON by default), and Celery's prefork pool and
multiprocessing pickle it between processes. Both rebuild an exception as
``type(exc)(*exc.args)``; an exception whose constructor takes other arguments
than its ``args`` comes back as a bare ``Exception`` or with another message.
"""

from __future__ import annotations

import pickle
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery, states

import effectq
import effectq.dramatiq.middleware
import effectq.steps
import effectq.tools
from effectq import errors
from effectq.store.base import Claim, ClaimKind, Record, Status

KEY = "order-7:payments.charge:9f2c"
RECORD = Record(
    key=KEY,
    status=Status.UNKNOWN,
    token=3,
    attempt=1,
    name="payments.charge",
    run_id="order-7",
    error="lease expired while dispatched",
    created_at=datetime(2026, 11, 30, 7, 0, tzinfo=UTC),
)
CLAIM = Claim(kind=ClaimKind.CLAIMED, token=4, attempt=2, status=Status.DISPATCHED)

SAMPLES: list[errors.EffectqError] = [
    errors.EffectqError("something effectq says"),
    errors.OutcomeUnknown(
        KEY, name="payments.charge", reason="lease expired", record=RECORD, namespace="shop"
    ),
    errors.InProgress(KEY, name="payments.charge", waited=2.5, owner="host:42:ab"),
    errors.StoreError("effectq claim failed on Redis: ConnectionError: refused"),
    errors.CorruptRecordError(KEY, "type list"),
    errors.ReplicationError(KEY, "a write was not replicated", acknowledged=0, required=1),
    errors.ClaimNotReplicatedError(KEY, claim=CLAIM, acknowledged=0, required=1),
    errors.CompletionNotReplicatedError(
        KEY, acknowledged=0, required=2, name="payments.charge", result={"id": "ch_1"}
    ),
    errors.NoActiveRun("payments.charge"),
    errors.NoActiveEffect("current_effect() outside an effect"),
    errors.InvalidInputError("argument card is a socket", argument="card"),
    errors.InvalidKeyError("a key must be a non-empty str"),
    errors.InputMismatchError(KEY, name="payments.charge", recorded_hash="a" * 64, input_hash="b" * 64),
    errors.ResultNotRecordedError(KEY, name="payments.charge", reason="too_large"),
    errors.ResultDecodeError(KEY, name="payments.charge", detail="field id missing"),
    errors.ReconcileError(KEY, name="payments.charge"),
    errors.ReentrantEffectError(KEY, name="payments.charge"),
    errors.AttemptsExhausted(
        KEY, name="payments.charge", attempts=3, last_error="builtins.MemoryError", namespace="shop"
    ),
    errors.RecordedFailure(
        KEY,
        name="payments.charge",
        type_name="shop.errors.CardDeclined",
        message="card declined: insufficient funds",
        args_json='["card declined: insufficient funds"]',
        detail="its type does not import here",
        namespace="shop",
    ),
    errors.ResolveRefusedError(KEY, "completed", "already completed"),
    errors.ConfigurationError("lease must be positive"),
    effectq.steps.StepDivergedError(
        "order-7:agent.plan:#2",
        name="agent.plan",
        ordinal=2,
        run_id="order-7",
        recorded_hash="c" * 64,
        input_hash="d" * 64,
    ),
    effectq.tools.ToolNotAllowed("delete_repo"),
    effectq.dramatiq.middleware.RunNotBoundError("msg-1", "no store answered"),
]

OBJECTS = {"record", "claim", "result"}
"""Attributes that hold objects, not plain values: pickled, but not sent as JSON."""


def _every_class(cls: type[BaseException]) -> set[type[BaseException]]:
    found = {cls}
    for sub in cls.__subclasses__():
        if sub.__module__.startswith("effectq"):
            found |= _every_class(sub)
    return found


def _id(exc: BaseException) -> str:
    return type(exc).__name__


def test_every_effectq_exception_has_a_sample() -> None:
    """A new exception class is held to the same: add it to SAMPLES."""
    assert _every_class(errors.EffectqError) == {type(exc) for exc in SAMPLES}


def test_every_exception_is_defined_in_errors_and_drawn_in_its_tree() -> None:
    """One module holds them all, its docstring the tree; the one that is also a Dramatiq
    ``MiddlewareError`` stays with Dramatiq, so that ``import effectq`` needs no Dramatiq."""
    found = _every_class(errors.EffectqError)
    elsewhere = {cls for cls in found if cls.__module__ != "effectq.errors"}
    assert elsewhere == {effectq.dramatiq.middleware.RunNotBoundError}
    assert errors.__doc__ is not None
    drawn = set(re.findall(r"[├└]── (?:effectq\.\w+\.)?(\w+)", errors.__doc__))
    assert drawn == {cls.__name__ for cls in found} - {"EffectqError"}
    assert set(errors.__all__) == {cls.__name__ for cls in found - elsewhere}


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_pickle_keeps_the_class_the_message_and_every_attribute(exc: errors.EffectqError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert vars(back) == vars(exc)
    assert back.args == exc.args


@pytest.fixture
def backend(redis_url: str) -> Iterator[Any]:
    """Celery's Redis result backend, JSON as Celery serializes results by default."""
    app = Celery("errors", broker="memory://", backend=redis_url, set_as_current=False)
    app.conf.result_serializer = "json"
    app.conf.accept_content = ["json"]
    yield app.backend
    app.close()


@pytest.mark.parametrize("exc", SAMPLES, ids=_id)
def test_a_failed_task_s_exception_comes_back_from_the_json_result_backend(
    backend: Any, exc: errors.EffectqError
) -> None:
    task_id = f"errors-{uuid.uuid4().hex[:8]}"
    backend.store_result(task_id, exc, states.FAILURE)
    try:
        back = backend.get_result(task_id)
    finally:
        backend.forget(task_id)
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    for name, value in vars(exc).items():
        assert getattr(back, name) == (None if name in OBJECTS else value), name


def test_a_task_s_outcome_unknown_reaches_the_caller_through_redis(
    redis_url: str, redis_store: effectq.RedisStore
) -> None:
    """A task redelivered after its effect timed out meets the unknown outcome: the caller gets
    OutcomeUnknown with its key from the Redis result backend, and can tell the operator what to
    resolve."""
    import effectq.celery

    app = Celery("errors", broker="memory://", backend=redis_url, set_as_current=False)
    app.conf.update(task_always_eager=True, task_store_eager_result=True, result_serializer="json")
    effectq.celery.install(app, redis_store)

    @effectq.effect(name="errors.wire")
    def wire() -> None:
        raise TimeoutError("the bank did not answer")

    @app.task(shared=False)
    def pay() -> None:
        wire()

    app.finalize()
    task_id = f"errors-{uuid.uuid4().hex[:8]}"
    try:
        pay.apply(task_id=task_id)  # the timeout: the effect is recorded as unknown
        pay.apply(task_id=task_id)  # the redelivery meets it
        caller = Celery("caller", backend=redis_url, set_as_current=False)  # another process's view
        caller.conf.update(result_serializer="json", accept_content=["json"])
        with pytest.raises(effectq.OutcomeUnknown) as raised:
            caller.AsyncResult(task_id).get(timeout=5)
        assert raised.value.key.startswith(f"{task_id}:errors.wire:")
        assert raised.value.name == "errors.wire"
        assert "effectq resolve" in str(raised.value)
    finally:
        app.backend.forget(task_id)
        app.effectq_installation.uninstall()  # type: ignore[attr-defined]
