"""Real workers, real brokers, real SIGKILL: a redelivered task never repeats an applied effect.

Each test starts worker processes of :mod:`effectq.chaos.workload` (a Celery
worker or a Dramatiq worker) against the local Redis and RabbitMQ, and judges
the outcome by the ledger, an external record of every application.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectq.chaos.workload import WorkloadConfig
from tests.conftest import REDIS_URL
from tests.support.rig import Rig

AMQP_URL = os.environ.get("EFFECTQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

CONFIGS = {
    "celery-redis": ("celery", REDIS_URL, "prefork"),
    "celery-rabbitmq": ("celery", AMQP_URL, "solo"),
    "dramatiq-rabbitmq": ("dramatiq", AMQP_URL, "solo"),
    "dramatiq-redis": ("dramatiq", REDIS_URL, "solo"),
}

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(240)]


@pytest.fixture(params=sorted(CONFIGS))
def rig(request: pytest.FixtureRequest, redis_url: str, tmp_path: Path) -> Iterator[Rig]:
    kind, broker, pool = CONFIGS[request.param]
    config = WorkloadConfig(
        kind=kind, broker=broker, store=REDIS_URL, ledger=REDIS_URL, name=f"rw{uuid.uuid4().hex[:10]}",
        visibility=3.0,
    )  # fmt: skip
    made = Rig(config, tmp_path, pool=pool)
    yield made
    made.close()


def test_worker_killed_after_second_effect(rig: Rig) -> None:
    """A task of three effects, its worker SIGKILLed after the second, is redelivered; each applies once."""
    rig.producer.send(0, 3, hold_after=2)
    rig.worker.start()
    rig.wait("armed")
    assert rig.ledger.counts() == {"0:0": 1, "0:1": 1}
    rig.worker.kill()
    rig.worker.start()
    (done,) = rig.wait("done")
    assert rig.ledger.counts() == {"0:0": 1, "0:1": 1, "0:2": 1}
    assert (done["replayed"], done["executed"]) == (2, 1)
    assert len(rig.ledger.events("start")) == 2  # the task really ran twice


def test_retry_after_one_effect_does_not_repeat_it(rig: Rig) -> None:
    """A task that asks for a retry (self.retry() / dramatiq.Retry) after one effect: the retry replays it."""
    rig.producer.send(0, 2, retry_after=1)
    rig.worker.start()
    (done,) = rig.wait("done")
    assert rig.ledger.counts() == {"0:0": 1, "0:1": 1}
    assert len(rig.ledger.events("retry")) == 1
    assert (done["replayed"], done["executed"]) == (1, 1)
