"""The pytest plugin at the edges: what it costs a run that does not use it, where its Redis is,
and what a fixture says when a package it needs is missing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytest_plugins = ["pytester"]


def test_a_run_that_uses_no_fixture_loads_nothing_of_effectq(tmp_path: Path) -> None:
    """With the plugin installed, a pytest run that asks for none of its fixtures imports only the
    plugin module and its two packages (nothing for pytest to rewrite, no pydantic)."""
    code = (
        "import json, sys, pytest\n"
        "pytest.main(['--co', '-q', '-p', 'no:cacheprovider', sys.argv[1]])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('effectq', 'pydantic'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=tmp_path,
    )
    assert json.loads(out.stdout.splitlines()[-1]) == ["effectq", "effectq.testing", "effectq.testing.plugin"]


BLOCK = """
import sys

class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {missing!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, _Missing())
"""


@pytest.mark.parametrize(
    ("missing", "args", "fixture", "needs"),
    [
        ({"fakeredis"}, [], "effectq_ledger", "fakeredis with Lua"),
        ({"lupa"}, [], "effectq_ledger", "fakeredis with Lua"),
        ({"fakeredis"}, ["--effectq-store=fakeredis"], "effectq_store", "fakeredis with Lua"),
        ({"redis"}, ["--effectq-store=redis"], "effectq_store", "redis-py"),
    ],
)
def test_a_fixture_says_what_to_install(
    pytester: pytest.Pytester, missing: set[str], args: list[str], fixture: str, needs: str
) -> None:
    """A fixture whose package is missing errors with one line naming the extra, not a traceback."""
    pytester.makeconftest(BLOCK.format(missing=missing))
    pytester.makepyfile(f"def test_it({fixture}):\n    pass\n")
    result = pytester.runpytest_subprocess(*args, "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"{fixture} needs {needs}: pip install 'effectq[testing]'"])
    assert "ModuleNotFoundError" not in result.stdout.str()


WHICH_DB = """
def test_db(effectq_store, effectq_ledger):
    for client in (effectq_store.inner.client, effectq_ledger.client):
        print("db", client.connection_pool.connection_kwargs["db"])
"""


def _with_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return parts._replace(path=f"/{db}").geturl()


@pytest.mark.redis
def test_ini_options_the_environment_and_the_command_line_choose_the_redis(
    pytester: pytest.Pytester, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """effectq_store and effectq_redis_url in the ini file choose the store and its Redis;
    EFFECTQ_TEST_REDIS_URL overrides the ini file, --effectq-redis-url overrides both."""
    monkeypatch.delenv("EFFECTQ_TEST_REDIS_URL", raising=False)
    monkeypatch.delenv("EFFECTQ_TEST_STORE", raising=False)
    pytester.makeini(f"[pytest]\neffectq_store = redis\neffectq_redis_url = {_with_db(redis_url, 14)}\n")
    pytester.makepyfile(WHICH_DB)

    def dbs(*args: str) -> list[str]:
        result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", *args)
        result.assert_outcomes(passed=1)
        return re.findall(r"db \d+", result.stdout.str())

    assert dbs() == ["db 14", "db 14"]
    monkeypatch.setenv("EFFECTQ_TEST_REDIS_URL", _with_db(redis_url, 13))
    assert dbs() == ["db 13", "db 13"]
    assert dbs(f"--effectq-redis-url={_with_db(redis_url, 12)}") == ["db 12", "db 12"]


@pytest.mark.redis
def test_the_default_redis_is_database_15(
    pytester: pytest.Pytester, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked for a real Redis and given no URL, the plugin uses database 15 of 127.0.0.1:6379,
    never database 0 where an application's own data usually lives."""
    parts = urlsplit(redis_url)
    if (parts.hostname, parts.port or 6379) != ("127.0.0.1", 6379):
        pytest.skip("the test Redis is not at the plugin's default address")
    monkeypatch.delenv("EFFECTQ_TEST_REDIS_URL", raising=False)
    pytester.makepyfile(WHICH_DB)
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", "--effectq-store=redis")
    result.assert_outcomes(passed=1)
    assert re.findall(r"db \d+", result.stdout.str()) == ["db 15", "db 15"]


def test_the_store_kind_from_the_ini_file(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """effectq_store in the ini file chooses the store; the command line overrides it."""
    monkeypatch.delenv("EFFECTQ_TEST_STORE", raising=False)
    pytester.makeini("[pytest]\neffectq_store = fakeredis\n")
    pytester.makepyfile(
        "def test_kind(effectq_store):\n    print('kind', type(effectq_store.inner).__name__)\n"
    )
    for args, kind in (((), "RedisStore"), (("--effectq-store=memory",), "MemoryStore")):
        result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider", *args)
        result.assert_outcomes(passed=1)
        assert re.findall(r"kind \w+", result.stdout.str()) == [f"kind {kind}"]
