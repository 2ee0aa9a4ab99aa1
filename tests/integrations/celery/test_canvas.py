"""Celery canvas with effects: run ids from the request (group, root, parent, task id), a chord
callback applying its effect once per chord, a chain whose steps each apply once.

The first tests run tasks eagerly; the others start real workers of
:mod:`tests.support.canvas_app` on the Redis broker and result backend, SIGKILL one inside a task,
and judge by the ledger, an external record of every application.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord

import effectq
import effectq.celery
from effectq.chaos.workload import WorkloadConfig
from effectq.integration import TaskRequest
from tests.support.rig import Rig

# -- run ids from the request, on Celery's eager path ---------------------------------------


@pytest.fixture
def app() -> Iterator[Celery]:
    made = Celery("canvas", broker="memory://", backend="cache+memory://", set_as_current=False)
    made.conf.update(task_always_eager=True, task_store_eager_result=True)
    yield made
    installation = getattr(made, "effectq_installation", None)
    if installation is not None:
        installation.uninstall()


def test_template_names_request_fields(app: Celery, store: effectq.Store) -> None:
    """{request.id} and {request.root_id} in effectq_run_id are the delivery's own fields, beside
    the arguments (an eager task is its own root)."""
    effectq.celery.install(app, store)

    @app.task(shared=False, effectq_run_id="flow:{request.root_id}:{order_id}:{request.id}")
    def fulfil(order_id: int) -> str:
        return effectq.current_run().id

    assert fulfil.apply(args=(5,), task_id="t-5").get() == "flow:t-5:5:t-5"


def test_request_field_the_delivery_lacks_binds_nothing(
    app: Celery, store: effectq.Store, caplog: pytest.LogCaptureFixture
) -> None:
    """A template naming request.group for a task sent outside a group binds no run (never a run id
    "chord:None" shared by every such task): the effect does not run and the log says why."""
    effectq.celery.install(app, store)
    applied: list[int] = []

    @effectq.effect(name="canvas.total")
    def record(n: int) -> int:
        applied.append(n)
        return n

    @app.task(shared=False, effectq_run_id="chord:{request.group}")
    def total(n: int) -> int:
        return record(n)

    result = total.apply(args=(3,), task_id="lonely")
    assert isinstance(result.result, effectq.NoActiveRun)
    assert applied == []
    assert "names request.group, which task lonely does not have" in caplog.text


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("x:{request.hostname}", "a run id may name request.id, request.group, request.root_id"),
        ("x:{request}", "names the whole request"),
    ],
)
def test_unknown_request_field_is_named(
    app: Celery, store: effectq.Store, caplog: pytest.LogCaptureFixture, template: str, said: str
) -> None:
    """A template naming a request field a run id may not use (or the request itself) binds nothing."""
    effectq.celery.install(app, store)

    @app.task(shared=False, effectq_run_id=template)
    def job() -> str:
        return effectq.current_run().id

    assert isinstance(job.apply().result, effectq.NoActiveRun)
    assert said in caplog.text


def test_run_id_function_of_args_and_request(app: Celery, store: effectq.Store) -> None:
    """A function (args, request) gets the arguments by name (defaults applied) and the request;
    a function of the task's arguments keeps working as before."""
    effectq.celery.install(app, store)
    seen: list[tuple[dict[str, Any], TaskRequest]] = []

    def by_request(args: dict[str, Any], request: TaskRequest) -> str:
        seen.append((args, request))
        return f"{request.root_id}:{args['order_id']}:{args['amount']}"

    @app.task(shared=False, effectq_run_id=by_request)
    def fulfil(order_id: int, amount: int = 5) -> str:
        return effectq.current_run().id

    @app.task(shared=False, effectq_run_id=lambda order_id: f"order:{order_id}")
    def legacy(order_id: int) -> str:
        return effectq.current_run().id

    assert fulfil.apply(args=(7,), task_id="t-7").get() == "t-7:7:5"
    (args, request), = seen  # fmt: skip
    assert args == {"order_id": 7, "amount": 5}
    assert (request.id, request.group, request.root_id, request.parent_id) == ("t-7", None, "t-7", None)
    assert legacy.apply(args=(8,)).get() == "order:8"


# -- real workers ---------------------------------------------------------------------------


class CanvasRig(Rig):
    """A worker of tests.support.canvas_app, and a producer's app sending canvases by task name."""

    def __init__(self, redis_url: str, log_dir: Path) -> None:
        config = WorkloadConfig(
            kind="celery", broker=redis_url, store=redis_url, ledger=redis_url,
            name=f"cv{uuid.uuid4().hex[:10]}", module="tests.support.canvas_app", visibility=3.0,
        )  # fmt: skip
        super().__init__(config, log_dir, pool="solo", log_lines=80)
        prefix = f"effectq-chaos-{config.name}:"
        self.app = Celery(f"effectq-canvas-producer-{config.name}", set_as_current=False)
        self.app.conf.update(
            broker_url=redis_url,
            result_backend=redis_url,
            result_backend_transport_options={"global_keyprefix": prefix},
            broker_transport_options={"global_keyprefix": prefix},
            task_default_queue=config.queue,
            broker_connection_retry_on_startup=True,
        )

    def signature(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self.app.signature(name, args=args, kwargs=kwargs, queue=self.config.queue)

    def close(self) -> None:
        self.app.close()
        super().close()


@pytest.fixture
def rig(redis_url: str, tmp_path: Path) -> Iterator[CanvasRig]:
    made = CanvasRig(redis_url, tmp_path)
    yield made
    made.close()


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(300)
def test_chord_callback_applies_its_effect_once_per_chord(rig: CanvasRig) -> None:
    """A chord of three header tasks, each applying one effect, and a callback keyed by the chord's
    group id: the worker is SIGKILLed in the callback after its effect, the callback is delivered
    again, then sent once more under a new task id with the same group. Each header effect and the
    callback's effect apply once; the later deliveries replay the callback's."""
    header = [rig.signature("canvas.part", n) for n in range(3)]
    result = chord(header)(rig.signature("canvas.total", hold=True))
    group_id = result.parent.id
    rig.worker.start()
    rig.wait("armed")
    expected = {"part:0": 1, "part:1": 1, "part:2": 1, "total": 1}
    assert rig.ledger.counts() == expected
    rig.worker.kill()
    rig.worker.start()
    (done,) = rig.wait("total-done")
    assert result.get(timeout=60) == 3
    assert rig.ledger.counts() == expected
    parts = rig.ledger.events("part")
    first, again = rig.ledger.events("total-start")
    # The callback's request: its own frozen task id on every delivery, the chord's group id; its
    # parent (and root) is whichever header task finished last, so neither names the chord.
    assert first["id"] == again["id"] == result.id
    assert first["group"] == group_id == done["group"]
    assert first["parent"] in {p["id"] for p in parts}
    assert {p["group"] for p in parts} == {group_id}
    assert [p["run"] for p in parts] == [p["id"] for p in parts]  # header tasks: their task ids
    assert done["run"] == f"chord:{group_id}"
    assert (done["replayed"], done["executed"]) == (1, 0)

    # What a second dispatch of the callback under another task id would be.
    again_result = rig.app.send_task(
        "canvas.total", args=([0, 1, 2],), group_id=group_id, queue=rig.config.queue
    )
    assert again_result.get(timeout=60) == 3
    _, resent = rig.wait("total-done", 2)
    assert resent["id"] == again_result.id != result.id
    assert resent["run"] == f"chord:{group_id}"
    assert (resent["replayed"], resent["executed"]) == (1, 0)
    assert rig.ledger.counts() == expected


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(300)
def test_chain_steps_each_apply_once(rig: CanvasRig) -> None:
    """A chain of three steps, each applying one effect, its worker SIGKILLed in the second step after
    the effect: the redelivered step replays it, the chain goes on, each effect applies once; every
    step shares the chain's root id, and each names the step before it as its parent."""
    steps = chain(
        rig.signature("canvas.step", 0, 0),
        rig.signature("canvas.step", 1, hold=True),
        rig.signature("canvas.step", 2),
    )
    result = steps.apply_async()
    rig.worker.start()
    rig.wait("armed")
    assert rig.ledger.counts() == {"step:0": 1, "step:1": 1}
    rig.worker.kill()
    rig.worker.start()
    assert result.get(timeout=120) == 3
    done = rig.wait("step-done", 3)
    assert rig.ledger.counts() == {"step:0": 1, "step:1": 1, "step:2": 1}
    by_step = {d["n"]: d for d in done}
    assert [by_step[n]["replayed"] for n in range(3)] == [0, 1, 0]
    root = by_step[0]["id"]
    assert {d["root"] for d in done} == {root}
    assert by_step[1]["parent"] == by_step[0]["id"] and by_step[2]["parent"] == by_step[1]["id"]
    assert all(d["run"] == d["id"] for d in done)  # the default run id: each step's task id
