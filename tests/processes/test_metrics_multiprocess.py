"""Prometheus with forked workers: every worker's counts and one set of store gauges, from one registry.

Real processes: a parent in prometheus_client's multiprocess mode installs effectq's
metrics and forks workers (as Celery's prefork pool does) that run effects on a real
Redis; the parent then serves :func:`effectq.metrics.multiprocess_registry`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

import effectq
import effectq.metrics
from effectq.errors import ConfigurationError
from tests.conftest import delete_namespace

ROOT = Path(__file__).resolve().parents[2]

_PARENT = textwrap.dedent(
    """
    import json, multiprocessing, sys
    import effectq, effectq.metrics

    url, namespace, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    effectq.metrics.install()  # before the fork, as in Celery's main process

    @effectq.effect(name="mp.send")
    def send(i: int) -> int:
        return i

    @effectq.effect(name="mp.charge")
    def charge(i: int) -> int:
        raise TimeoutError("gateway read timed out")  # maybe applied: an unknown record

    def work(n: int) -> None:
        store = effectq.RedisStore.from_url(url, namespace=namespace)
        with effectq.run(f"run-{n}", store=store):
            for i in range(5):
                send(i)
            try:
                charge(n)
            except TimeoutError:
                pass
        store.close()

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=work, args=(n,)) for n in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    store = effectq.RedisStore.from_url(url, namespace=namespace)
    registry = effectq.metrics.multiprocess_registry(stores=[store], min_interval=0)
    value = registry.get_sample_value
    ns = {"namespace": namespace}
    print(json.dumps({
        "executed": value("effectq_events_total", {"kind": "executed", "effect": "mp.send", **ns}),
        "unknown_events": value("effectq_events_total", {"kind": "unknown", "effect": "mp.charge", **ns}),
        "claims": value("effectq_step_duration_seconds_count", {"step": "claim", "effect": "mp.send"}),
        "unknown_records": value("effectq_unknown_records", {"namespace": namespace}),
        "store_up": value("effectq_store_up", {"namespace": namespace}),
        "gauge_families": sum(1 for m in registry.collect() if m.name == "effectq_unknown_records"),
    }))
    """
)


def test_forked_workers_counts_and_the_stores_gauges_are_served_by_one_registry(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    workers = 3
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    client = redis.Redis.from_url(redis_url)
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PARENT, redis_url, namespace, str(workers)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        seen = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        delete_namespace(client, namespace)
        client.close()
    assert seen == {
        "executed": 5.0 * workers,  # summed over the workers' files
        "unknown_events": 1.0 * workers,
        "claims": 5.0 * workers,
        "unknown_records": 1.0 * workers,  # from Redis, once, not per worker
        "store_up": 1.0,
        "gauge_families": 1,
    }


def test_multiprocess_registry_without_a_directory_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("prometheus_multiproc_dir", raising=False)
    with pytest.raises(ConfigurationError, match="set PROMETHEUS_MULTIPROC_DIR"):
        effectq.metrics.multiprocess_registry()
    with pytest.raises(ConfigurationError, match="PROMETHEUS_MULTIPROC_DIR"):
        effectq.metrics.multiprocess_registry(path=str(tmp_path / "missing"))


def test_install_with_stores_in_multiprocess_mode_says_where_the_gauges_belong(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    redis_store: effectq.RedisStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from prometheus_client import CollectorRegistry

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with caplog.at_level("WARNING", logger="effectq.metrics"):
        metrics = effectq.metrics.install(CollectorRegistry(), stores=[redis_store])
    metrics.uninstall()
    assert "multiprocess_registry()" in caplog.text
