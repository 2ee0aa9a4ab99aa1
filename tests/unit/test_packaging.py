"""The promises of the README: its two commands, the CI script, the wheel's contents, the demo."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [block.strip() for block in blocks[:2]]


def test_readme_opens_with_install_and_demo_then_tests() -> None:
    """The first command installs and runs the demo; the second runs the tests."""
    demo, tests = readme_commands()
    assert "pip install" in demo and "effectq.demo" in demo
    assert "pytest" in tests


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """.ci/run runs the README's test command, verbatim."""
    _, tests = readme_commands()
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_what_working_on_effectq_needs_is_dependency_groups_not_extras() -> None:
    """dev, test and bench are PEP 735 groups (not in the wheel's metadata for users to pick);
    the test command installs its group beside every extra, with a pip that reads groups."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    groups = project["dependency-groups"]
    assert {"dev", "test", "bench"} <= set(groups)
    assert not {"dev", "test", "bench"} & set(project["project"]["optional-dependencies"])
    assert {"include-group": "test"} in groups["dev"]
    _, tests = readme_commands()
    assert "'pip>=25.1'" in tests and "-e '.[all]' --group test" in tests


def test_import_needs_no_optional_extra() -> None:
    """`import effectq` works without redis, celery or dramatiq importable."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in {'redis', 'celery', 'dramatiq', 'fakeredis'}:\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import effectq\n"
        "try:\n"
        "    effectq.RedisStore.from_url('redis://x')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'effectq[redis]'" in out.stdout


@pytest.mark.slow
def test_wheel_carries_the_lua_scripts(tmp_path: Path) -> None:
    """The built wheel holds every Lua script and the py.typed marker."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    wheel = next(tmp_path.glob("effectq-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    scripts = {p.name for p in (ROOT / "effectq/store/redis/lua").glob("*.lua")}
    assert scripts
    assert {f"effectq/store/redis/lua/{name}" for name in scripts} <= names
    assert "effectq/py.typed" in names


@pytest.mark.slow
@pytest.mark.parametrize("where", ["embedded", "redis"])
def test_demo_runs_and_applies_everything_once(where: str, redis_url: str) -> None:
    """The demo's redelivery repeats nothing, on the embedded server and on a real Redis."""
    args = [sys.executable, "-m", "effectq.demo"] + (["--redis-url", redis_url] if where == "redis" else [])
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "with effectq:    1 email, 1 payment, 1 chat" in out.stdout
    assert "without effectq: 2 email, 2 payment, 1 chat" in out.stdout
