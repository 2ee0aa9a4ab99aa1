"""An installation's settings: what :func:`~effectq.celery.install` was given, else the app's
configuration (read the way Celery reads its own settings), else the environment, else the
defaults. Read once, when first needed; every problem is a :class:`~effectq.ConfigurationError`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from ..options import seconds
from ..store.base import Store

__all__ = ["SETTINGS", "Settings", "read_settings"]

SETTINGS = (
    "effectq_url",
    "effectq_namespace",
    "effectq_in_progress_countdown",
    "effectq_lease",
    "effectq_retention",
    "effectq_redis_options",
)
"""The app settings :func:`install` reads for the arguments it was not given (under the app's
namespace too: ``CELERY_EFFECTQ_URL`` with ``config_from_object(..., namespace="CELERY")``)."""

_DEFAULTS: dict[str, Any] = {
    "namespace": "default",
    "in_progress_countdown": 5.0,
    "lease": 60.0,
    "retention": timedelta(days=7),
}
_ENVIRONMENT = {"store": "EFFECTQ_URL", "namespace": "EFFECTQ_NAMESPACE"}


@dataclass(frozen=True)
class Settings:
    """What an installation runs with, once read (see :data:`SETTINGS`).

    Attributes:
        store: the store, or the Redis URL each worker process builds its store from.
        namespace: the namespace of a store built from a URL.
        in_progress_countdown: seconds before the retry an in-flight effect causes.
        lease: the longest effect lease the app's effects use (for the start-up check).
        retention: the shortest effect retention the app's effects use (for the check).
        redis_options: passed to :meth:`effectq.RedisStore.from_url`.
        origin: where each of them came from: ``install()``, the setting's name, the
            environment variable's name, or ``default``.
    """

    store: Store | str
    namespace: str
    in_progress_countdown: float
    lease: float | timedelta
    retention: float | timedelta
    redis_options: Mapping[str, Any] = field(default_factory=dict)
    origin: Mapping[str, str] = field(default_factory=dict)


def read_settings(app: Any, given: Mapping[str, Any]) -> Settings:
    """The settings of an installation: ``given`` (the arguments of :func:`install` that
    are not ``None``) win, then the app's configuration, then the environment, then the
    defaults. Raises :class:`~effectq.ConfigurationError` naming what is missing or wrong."""
    conf = app.conf
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name in ("store", "namespace", "in_progress_countdown", "lease", "retention"):
        setting = "effectq_url" if name == "store" else f"effectq_{name}"
        variable = _ENVIRONMENT.get(name)
        configured = conf.get(setting)  # Celery's lookup: effectq_url, or CELERY_EFFECTQ_URL
        if given.get(name) is not None:
            values[name], origin[name] = given[name], f"install({name}=...)"
        elif configured is not None:
            values[name], origin[name] = configured, _setting_name(app, setting)
        elif variable and os.environ.get(variable):
            values[name], origin[name] = os.environ[variable], variable
        elif name in _DEFAULTS:
            values[name], origin[name] = _DEFAULTS[name], "default"
    store = values.get("store")
    if store is None:
        raise ConfigurationError(
            f"effectq.celery.install({app.main or app!r}): no store for the app's effects. Pass one "
            f'(install(app, "redis://host:6379/0")), set effectq_url in the app\'s configuration '
            f'(CELERY_EFFECTQ_URL in Django\'s settings, read with namespace="CELERY"), or set EFFECTQ_URL'
        )
    if not isinstance(store, (str, Store)) or not store:
        raise ConfigurationError(
            f"{origin['store']} must be a redis:// URL or an effectq store, not {store!r}"
        )
    if not isinstance(values["namespace"], str) or not values["namespace"]:
        raise ConfigurationError(
            f"{origin['namespace']} must be a non-empty string, not {values['namespace']!r}"
        )
    for name in ("lease", "retention"):
        seconds(values[name], option=origin[name])  # refused here, before any task runs
    redis_options = conf.get("effectq_redis_options") or {}
    if not isinstance(redis_options, Mapping):
        raise ConfigurationError(
            f"{_setting_name(app, 'effectq_redis_options')} must be a mapping, not {redis_options!r}"
        )
    return Settings(
        store=store,
        namespace=values["namespace"],
        in_progress_countdown=seconds(
            values["in_progress_countdown"], option=origin["in_progress_countdown"]
        ),
        lease=values["lease"],
        retention=values["retention"],
        redis_options={**redis_options, **given.get("redis_options", {})},
        origin=origin,
    )


def _setting_name(app: Any, setting: str) -> str:
    """A setting as the user may have spelled it: ``effectq_url (CELERY_EFFECTQ_URL)``."""
    prefix = getattr(app, "namespace", None)
    if not prefix:
        return setting
    spelled = f"{prefix.rstrip('_')}_{setting}"
    return f"{setting} ({spelled.upper() if prefix.isupper() else spelled.lower()})"
