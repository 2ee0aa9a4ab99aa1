"""The examples and docker-compose.yml stay runnable: what they name exists."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, object]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]


def test_compose_names_redis_rabbitmq_and_both_workers() -> None:
    """docker-compose.yml runs Redis, RabbitMQ, a Celery worker and a Dramatiq worker."""
    services = _compose()["services"]
    assert set(services) >= {"redis", "rabbitmq", "celery-worker", "dramatiq-worker"}  # type: ignore[operator]


def test_compose_worker_commands_point_at_real_apps() -> None:
    """Each worker command names an example module that defines the app or broker it needs."""
    services = _compose()["services"]
    celery_cmd = " ".join(services["celery-worker"]["command"])  # type: ignore[index]
    dramatiq_cmd = " ".join(services["dramatiq-worker"]["command"])  # type: ignore[index]
    celery_module = re.search(r"celery -A (\S+) worker", celery_cmd)
    dramatiq_module = re.search(r"&& dramatiq (\S+)", dramatiq_cmd)
    assert celery_module
    assert dramatiq_module
    celery_app = importlib.import_module(celery_module.group(1))
    assert type(celery_app.app).__name__ == "Celery"
    assert celery_app.app.conf.task_acks_late
    dramatiq_app = importlib.import_module(dramatiq_module.group(1))
    assert any(type(m).__name__ == "EffectMiddleware" for m in dramatiq_app.broker.middleware)
    for cmd in (celery_cmd, dramatiq_cmd):  # the extras it installs exist in pyproject.toml
        for extra in re.findall(r"\.\[(\w+)\]", cmd):
            assert f"\n{extra} = " in (ROOT / "pyproject.toml").read_text()
        assert shlex.split(cmd)[0] == "sh"


def test_compose_environment_is_what_the_examples_read() -> None:
    """The workers' environment variables are the ones the examples read, pointing at the compose services."""
    services = _compose()["services"]
    env = services["celery-worker"]["environment"]  # type: ignore[index]
    names = ("celery_app.py", "dramatiq_app.py", "shop.py")
    sources = "".join((ROOT / "examples" / name).read_text() for name in names)
    for name, value in env.items():
        assert f'"{name}"' in sources
        host = re.search(r"://(?:[^@/]*@)?([^:/]+)", value)
        assert host
        assert host.group(1) in services  # type: ignore[operator]
