"""effectq.celery.install(app) configured the Celery way: from the app's settings, Django-style
namespaced settings, the environment, or its own arguments (which win), and an error before
any task runs when no store is named anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis
from celery import Celery

import effectq
import effectq.celery
from effectq.celery.installation import Installation


@pytest.fixture
def apps() -> Iterator[list[Celery]]:
    """Apps a test makes; each one's installation is removed and its store closed afterwards."""
    made: list[Celery] = []
    yield made
    for app in made:
        installation: Installation | None = getattr(app, "effectq_installation", None)
        if installation is not None:
            if installation._source is not None:
                installation._source.reset()
            installation.uninstall()


@pytest.fixture(autouse=True)
def _no_effectq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of the machine running the suite must not name a store for these tests."""
    monkeypatch.delenv("EFFECTQ_URL", raising=False)
    monkeypatch.delenv("EFFECTQ_NAMESPACE", raising=False)


def new_app(apps: list[Celery], **conf: Any) -> Celery:
    app = Celery("config", broker="memory://", set_as_current=False)
    app.conf.update(task_always_eager=True, **conf)
    apps.append(app)
    return app


def effect_task(app: Celery) -> tuple[Any, list[str]]:
    """A task whose one effect counts its applications; returns (task, applications)."""
    applied: list[str] = []

    @effectq.effect(name="config.notify")
    def notify(order: str) -> str:
        applied.append(order)
        return f"sent {order}"

    @app.task(shared=False)
    def fulfil(order: str) -> str:
        return notify(order)

    app.finalize()
    return fulfil, applied


def records_in(client: redis.Redis, namespace: str) -> list[bytes]:
    return list(client.scan_iter(match=f"effectq:{{{namespace}}}*", count=1000)) + list(
        client.scan_iter(match=f"effectq:{{{namespace}:*", count=1000)
    )


def test_store_and_namespace_from_the_apps_configuration(
    apps: list[Celery], redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """effectq_url and effectq_namespace in app.conf name the store: the task's effect is recorded
    there, and a second delivery of the task replays it."""
    app = new_app(apps, effectq_url=redis_url, effectq_namespace=namespace)
    installation = effectq.celery.install(app)
    fulfil, applied = effect_task(app)
    assert fulfil.apply(args=("o-1",), task_id="t-1").get() == "sent o-1"
    assert fulfil.apply(args=("o-1",), task_id="t-1").get() == "sent o-1"
    assert applied == ["o-1"]
    assert records_in(redis_client, namespace)
    assert installation.settings.origin["store"] == "effectq_url"


class DjangoSettings:
    """What a Django settings.py holds (read with namespace="CELERY", as Celery's Django guide does)."""

    CELERY_BROKER_URL = "memory://"
    CELERY_TASK_ALWAYS_EAGER = True
    CELERY_EFFECTQ_IN_PROGRESS_COUNTDOWN = 2
    CELERY_EFFECTQ_REDIS_OPTIONS: ClassVar[dict[str, int]] = {"socket_timeout": 3}
    DEBUG = True  # not a Celery setting: ignored


def test_django_settings_through_celerys_namespace(
    apps: list[Celery], redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """CELERY_EFFECTQ_URL, CELERY_EFFECTQ_NAMESPACE and the other options in a settings object read
    with config_from_object(..., namespace="CELERY") configure the installation, as Celery's own
    CELERY_BROKER_URL does."""

    class Settings(DjangoSettings):
        CELERY_EFFECTQ_URL = redis_url
        CELERY_EFFECTQ_NAMESPACE = namespace

    app = Celery("proj", set_as_current=False)
    apps.append(app)
    app.config_from_object(Settings, namespace="CELERY")
    installation = effectq.celery.install(app)
    fulfil, applied = effect_task(app)
    assert fulfil.apply(args=("o-2",), task_id="t-2").get() == "sent o-2"
    assert fulfil.apply(args=("o-2",), task_id="t-2").get() == "sent o-2"
    assert applied == ["o-2"]
    assert records_in(redis_client, namespace)
    settings = installation.settings
    assert settings.origin["store"] == "effectq_url (CELERY_EFFECTQ_URL)"
    assert (settings.namespace, settings.in_progress_countdown) == (namespace, 2.0)
    assert installation.store.client.connection_pool.connection_kwargs["socket_timeout"] == 3  # type: ignore[attr-defined]
    assert app.conf.broker_url == "memory://"  # Celery read its own settings from the same object


def test_lowercase_settings_under_a_namespace(apps: list[Celery], redis_url: str, namespace: str) -> None:
    """Under namespace="CELERY" a lowercase effectq_url works too, as Celery's own settings do."""

    class Settings:
        effectq_url = redis_url
        effectq_namespace = namespace

    app = Celery("proj", broker="memory://", set_as_current=False)
    apps.append(app)
    app.config_from_object(Settings, namespace="CELERY")
    settings = effectq.celery.install(app).settings
    assert (settings.store, settings.namespace) == (redis_url, namespace)


def test_the_configuration_is_read_when_first_needed(
    apps: list[Celery], redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    """install() does not load an app configuration that is not loaded yet (Django's settings import
    the Celery app, then install() runs, before they are complete): what they hold when the first
    task runs is what counts."""

    class Late:  # settings still being written while the Celery app module is imported
        CELERY_BROKER_URL = "memory://"
        CELERY_TASK_ALWAYS_EAGER = True

    app = Celery("proj", set_as_current=False)
    apps.append(app)
    app.config_from_object(Late, namespace="CELERY")
    effectq.celery.install(app)
    assert not app.configured
    Late.CELERY_EFFECTQ_URL = redis_url  # type: ignore[attr-defined]
    Late.CELERY_EFFECTQ_NAMESPACE = namespace  # type: ignore[attr-defined]
    fulfil, applied = effect_task(app)
    assert fulfil.apply(args=("o-3",), task_id="t-3").get() == "sent o-3"
    assert applied == ["o-3"]
    assert records_in(redis_client, namespace)


def test_environment_is_the_fallback(
    apps: list[Celery], redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EFFECTQ_URL and EFFECTQ_NAMESPACE name the store when the configuration does not; the
    configuration wins over them."""
    monkeypatch.setenv("EFFECTQ_URL", redis_url)
    monkeypatch.setenv("EFFECTQ_NAMESPACE", namespace)
    settings = effectq.celery.install(new_app(apps)).settings
    assert (settings.store, settings.namespace) == (redis_url, namespace)
    assert settings.origin == {
        "store": "EFFECTQ_URL",
        "namespace": "EFFECTQ_NAMESPACE",
        "in_progress_countdown": "default",
        "lease": "default",
        "retention": "default",
    }
    configured = new_app(apps, effectq_url="redis://127.0.0.1:6399/3", effectq_namespace="shop")
    settings = effectq.celery.install(configured).settings
    assert (settings.store, settings.namespace) == ("redis://127.0.0.1:6399/3", "shop")


def test_arguments_win(apps: list[Celery], redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What install() is given wins over the configuration and the environment."""
    monkeypatch.setenv("EFFECTQ_URL", "redis://127.0.0.1:6398/0")
    app = new_app(apps, effectq_url="redis://127.0.0.1:6399/0", effectq_namespace="conf", effectq_lease=30)
    store = effectq.MemoryStore(namespace="given")
    settings = effectq.celery.install(app, store, namespace="arg", lease=90).settings
    assert (settings.store, settings.namespace, settings.lease) == (store, "arg", 90)
    assert settings.origin["store"] == "install(store=...)"


def test_no_store_anywhere_fails_at_install(apps: list[Celery]) -> None:
    """An app whose configuration is loaded and names no store: install() raises a
    ConfigurationError saying every way to name one."""
    app = new_app(apps)
    assert app.conf.task_always_eager  # the configuration is loaded
    with pytest.raises(effectq.ConfigurationError) as raised:
        effectq.celery.install(app)
    message = str(raised.value)
    assert "effectq_url" in message and "CELERY_EFFECTQ_URL" in message and "EFFECTQ_URL" in message
    assert getattr(app, "effectq_installation", None) is None


@pytest.mark.parametrize(
    ("setting", "value", "named"),
    [
        ("CELERY_EFFECTQ_URL", 6379, "effectq_url (CELERY_EFFECTQ_URL)"),
        ("CELERY_EFFECTQ_LEASE", "a minute", "effectq_lease (CELERY_EFFECTQ_LEASE)"),
        ("CELERY_EFFECTQ_IN_PROGRESS_COUNTDOWN", -1, "effectq_in_progress_countdown"),
        ("CELERY_EFFECTQ_NAMESPACE", "", "effectq_namespace (CELERY_EFFECTQ_NAMESPACE)"),
        ("CELERY_EFFECTQ_REDIS_OPTIONS", "socket_timeout=3", "effectq_redis_options"),
    ],
)
def test_a_wrong_setting_is_named(
    apps: list[Celery], redis_url: str, setting: str, value: Any, named: str
) -> None:
    """A setting of the wrong type or value is refused with its name as the user spelled it."""
    settings = type("Settings", (), {"CELERY_BROKER_URL": "memory://", "CELERY_EFFECTQ_URL": redis_url})
    setattr(settings, setting, value)
    app = Celery("proj", set_as_current=False)
    apps.append(app)
    app.config_from_object(settings, namespace="CELERY")
    app.conf.broker_url  # noqa: B018 - load it, so install() reads it at once
    with pytest.raises(effectq.ConfigurationError, match=r"must be") as raised:
        effectq.celery.install(app)
    assert named in str(raised.value)


def test_eager_task_without_store_applies_nothing(
    apps: list[Celery], caplog: pytest.LogCaptureFixture
) -> None:
    """An app configured after install() that never names a store: its first task binds no run, so
    its effect does not run (NoActiveRun), and the log says what is missing."""
    app = Celery("late", broker="memory://", set_as_current=False)
    apps.append(app)
    app.conf.update(task_always_eager=True)
    effectq.celery.install(app)
    fulfil, applied = effect_task(app)
    result = fulfil.apply(args=("o-4",))
    assert isinstance(result.result, effectq.NoActiveRun)
    assert applied == []
    assert "no store for the app's effects" in caplog.text


WORKER_APP = """
from celery import Celery
import effectq.celery

app = Celery("nostore", broker="memory://")
app.config_from_object({"task_acks_late": True})  # no effectq_url; EFFECTQ_URL unset
effectq.celery.install(app)


@app.task
def fulfil():
    pass
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_worker_without_store_does_not_start(tmp_path: Path) -> None:
    """A real worker of an app that names no store exits at start with the ConfigurationError,
    before it consumes anything."""
    (tmp_path / "nostore_app.py").write_text(textwrap.dedent(WORKER_APP))
    env = {k: v for k, v in os.environ.items() if k not in ("EFFECTQ_URL", "EFFECTQ_NAMESPACE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "nostore_app:app", "worker", "-P", "solo",
         "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "effectq.errors.ConfigurationError" in output and "no store for the app's effects" in output
    assert "ready." not in output  # the worker never started consuming
