"""The chaos runner on a user's own, unchanged app: examples/celery_app.py and examples/dramatiq_app.py.

``effectq chaos --app MODULE --send 'task(args)'`` runs real workers of the user's app under SIGKILLs;
what it counts comes from effectq's events (each effect that ran, by its key), not from code added
to the tasks. The runs go through the command line in a process of their own, as a user runs them
(the example reads its broker from the environment when it is imported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from effectq.testing.chaos.user import Send, parse_send
from tests.conftest import REDIS_URL

AMQP_URL = os.environ.get("EFFECTQ_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
ROOT = Path(__file__).resolve().parents[2]


def _chaos(tmp_path: Path, *argv: str, **env: str) -> dict[str, object]:
    command = [sys.executable, "-m", "effectq.chaos", "--json", "--progress", "0", "--log-dir", str(tmp_path)]
    command += ["--redis-url", REDIS_URL, "--amqp-url", AMQP_URL, *argv]
    done = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=280, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    return report


def test_send_templates_fill_the_task_number_and_a_unique_number() -> None:
    """``{n}`` is the task's number, ``{unique}`` a number of its own; arguments are Python literals."""
    assert Send("shop.fulfil({unique}, cents=5)").call(3, 1003) == ("shop.fulfil", (1003,), {"cents": 5})
    assert Send("fulfil('order-{n}')").call(2, 0) == ("fulfil", ("order-2",), {})
    with pytest.raises(ValueError, match="expected task_name"):
        parse_send("shop.fulfil(open('x'))")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_celery_example_unchanged_under_sigkills(tmp_path: Path) -> None:
    """examples/celery_app.py (on RabbitMQ, as its EXAMPLE_BROKER allows): each order's charge and
    receipt counted once by effectq's events across the redeliveries the SIGKILLs caused. The
    example's pause between them is 1 s here (EXAMPLE_PAUSE), the kills 1.5-3 s apart: as with its
    own 5 s, a kill lands between the charge and the receipt."""
    report = _chaos(
        tmp_path,
        *("--app", "examples.celery_app", "--send", "shop.fulfil({unique})", "--tasks", "8"),
        *("--kill-every", "1.5:3", "--target", "busy"),
        EXAMPLE_BROKER=AMQP_URL,
        EXAMPLE_PAUSE="1",
    )
    assert report["configuration"] == "celery-rabbitmq" and report["scenario"] == "examples.celery_app"
    assert report["kills"] and report["redeliveries"], report
    assert (report["applications"], report["duplicates"], report["not_done"]) == (16, 0, 0), report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_dramatiq_example_unchanged_under_sigkills(tmp_path: Path) -> None:
    """examples/dramatiq_app.py: the same, with the actor's own queue."""
    report = _chaos(
        tmp_path,
        *("--app", "examples.dramatiq_app", "--send", "fulfil({unique})", "--tasks", "8"),
        *("--kill-every", "1.5:3", "--target", "busy"),
        EXAMPLE_PAUSE="1",
    )
    assert report["configuration"] == "dramatiq-rabbitmq"
    assert report["kills"] and report["redeliveries"], report
    assert (report["applications"], report["duplicates"], report["not_done"]) == (16, 0, 0), report
