"""What an install promises: a plain ``pip install effectq``, the extras, and a light import."""

from __future__ import annotations

import ast
import configparser
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from effectq.cli import Exit

ROOT = Path(__file__).resolve().parents[2]

BLOCKER = """
import sys

class _Missing:
    '''Imports of these modules fail as they do where the package is not installed.'''

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + '.') for n in self.names):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _Missing(sys.argv[1].split(',')))
del sys.argv[1]
"""


def run_without(missing: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where the modules ``missing`` (comma-separated) are absent."""
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, missing, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


CLI = "import sys\nfrom effectq.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


# -- a missing extra -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["show", "k"],
        ["stats"],
        ["doctor"],
        ["purge", "--run", "r1"],
        ["resolve", "k", "--not-applied"],
    ],
)
def test_a_command_without_redis_py_names_the_extra(command: list[str]) -> None:
    """Without redis-py every Redis command says, in one line, which extra to install, and exits 5."""
    ran = run_without("redis,hiredis", CLI, *command, "--url", "redis://127.0.0.1:1/0")
    assert ran.returncode == Exit.MISSING_EXTRA == 5, ran.stderr
    assert ran.stderr.splitlines() == [
        "effectq: this command needs redis-py, which is not installed: pip install 'effectq[redis]'"
    ]
    assert ran.stdout == ""


def test_a_missing_extra_in_json() -> None:
    """With --json the same error is also a JSON object on stdout, with its exit code."""
    ran = run_without("redis", CLI, "list", "--json")
    assert ran.returncode == Exit.MISSING_EXTRA
    assert json.loads(ran.stdout) == {
        "error": "this command needs redis-py, which is not installed: pip install 'effectq[redis]'",
        "exit": 5,
        "extra": "redis",
    }


def test_chaos_without_its_framework_names_the_extra() -> None:
    """`effectq chaos` on a Celery configuration without Celery names the extra, exit 5."""
    ran = run_without("celery,kombu", CLI, "chaos", "celery-redis", "--size", "small")
    assert ran.returncode == Exit.MISSING_EXTRA, ran.stderr
    assert ran.stderr.splitlines() == [
        "effectq: this command needs Celery, which is not installed: pip install 'effectq[celery]'"
    ]


def test_help_and_version_need_no_extra() -> None:
    """--help and --version work without redis-py, and say which version is installed."""
    helped = run_without("redis", CLI, "--help")
    assert helped.returncode == 0 and "5 an extra is not installed" in helped.stdout
    version = run_without("redis", CLI, "--version")
    assert version.returncode == 0
    assert version.stdout.strip() == f"effectq {importlib.metadata.version('effectq')}"


def test_an_import_error_of_effectq_itself_is_not_hidden() -> None:
    """A module of effectq's own that fails to import while a command runs is a bug, no missing
    extra: its traceback shows."""
    ran = run_without("effectq.store.redis", CLI, "list")
    assert ran.returncode == 1
    assert "Traceback" in ran.stderr and "No module named 'effectq.store.redis'" in ran.stderr


# -- import cost ---------------------------------------------------------------------------


def test_import_effectq_loads_neither_pydantic_nor_redis() -> None:
    """`import effectq` loads no pydantic and no redis-py: they come with first use."""
    loaded = loaded_after("import effectq")
    assert not {m for m in loaded if m.split(".")[0] in ("pydantic", "pydantic_core", "redis")}
    assert "effectq._engine" not in loaded and "effectq._engine.drive" not in loaded


def test_the_command_line_loads_neither_pydantic_nor_the_engine() -> None:
    """`effectq --help` and `--version` load no pydantic, no redis-py, no engine, and not even
    the store or the admin functions the commands run."""
    for flag in ("--help", "--version"):
        loaded = loaded_after(f"from effectq.cli import main\nmain([{flag!r}])")
        assert not {m for m in loaded if m.split(".")[0] in ("pydantic", "redis")}, flag
        assert not {m for m in loaded if m.startswith(("effectq.store", "effectq._engine", "effectq.codec"))}
        assert (
            not {
                "effectq.ops.admin",
                "effectq.ops.doctor",
                "effectq.admin",
                "effectq.doctor",
                "effectq.effect",
            }
            & loaded
        ), flag


def test_every_public_name_resolves_lazily() -> None:
    """Each name of effectq.__all__ is there on first use, `from effectq import *` gives them all,
    and effectq.effect stays the decorator when a module that imports it loads first."""
    code = (
        "import effectq.steps, effectq.tools, effectq.integration, types\n"
        "import effectq\n"
        "assert callable(effectq.effect) and not isinstance(effectq.effect, types.ModuleType)\n"
        "from effectq import *\n"
        "missing = [n for n in effectq.__all__ if n not in globals()]\n"
        "assert not missing, missing\n"
        "assert effectq.RedisStore.__name__ == 'RedisStore' and effectq.events.EventKind\n"
        "assert set(effectq.__all__) <= set(dir(effectq))\n"
        "try:\n"
        "    effectq.no_such_name\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "has no attribute 'no_such_name'" in out.stdout


def test_the_names_the_type_checker_reads_are_all_and_resolve_to_their_home() -> None:
    """``effectq/__init__.py`` states its names twice, by necessity: imports for the type checker
    and a table for the lazy lookup. Both give ``__all__``, and each name is its home's object."""
    import effectq
    import effectq.errors

    tree = ast.parse((ROOT / "effectq" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    read: dict[str, tuple[str, str | None]] = {}  # name -> (module, its attribute; None: the module)
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            if alias.name == "*":
                read.update(dict.fromkeys(effectq.errors.__all__, (f"effectq.{node.module}", None)))
                continue
            assert alias.asname == alias.name  # an explicit re-export
            if node.module is None:  # from . import events as events
                read[alias.name] = (f"effectq.{alias.name}", None)
            else:
                read[alias.name] = (f"effectq.{node.module}", alias.name)
    assert set(read) == set(effectq.__all__)
    assert effectq.__all__ == sorted(effectq.__all__)
    for name, (home, attribute) in read.items():
        module = importlib.import_module(home)
        expected = module if attribute is None and home.endswith(f".{name}") else getattr(module, name)
        assert getattr(effectq, name) is expected, name


# -- the package's metadata ----------------------------------------------------------------


def test_tox_and_classifiers_name_the_same_pythons() -> None:
    """Every Python of the classifiers has its tox env, and the other way round."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classified = {
        c.rsplit(" ", 1)[1] for c in project["classifiers"] if re.fullmatch(r".*Python :: 3\.\d+", c)
    }
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini")
    envs = {e.strip() for e in tox["tox"]["env_list"].split(",")}
    assert classified == {"3.11", "3.12", "3.13"}
    assert {f"py3{v.split('.')[1]}" for v in classified} <= envs
    assert not {e for e in envs if re.fullmatch(r"py3\d+", e)} - {f"py3{v.split('.')[1]}" for v in classified}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """effectq's wheel, built from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=600,
    )
    return next(out.glob("effectq-*.whl"))


@pytest.mark.slow
def test_wheel_metadata(wheel: Path) -> None:
    """The license is an SPDX expression alone; each Dramatiq extra brings one broker's client;
    redis-py has a tested upper bound; a `testing` extra brings what the pytest plugin needs."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    lines = metadata.splitlines()
    assert "License-Expression: MIT" in lines
    assert not [line for line in lines if line.startswith("Classifier: License ::")]

    def requires(extra: str) -> set[str]:
        tail = f"; extra == '{extra}'"
        return {line[len("Requires-Dist: ") : -len(tail)] for line in lines if line.endswith(tail)}

    assert requires("dramatiq") == {"dramatiq[redis]>=1.16", "redis[hiredis]<9,>=5.0.1"}
    assert requires("dramatiq-rabbitmq") == {"dramatiq[rabbitmq]>=1.16", "redis[hiredis]<9,>=5.0.1"}
    assert requires("redis") == {"redis[hiredis]<9,>=5.0.1"}
    assert {"pytest>=8", "fakeredis[lua]>=2.23"} <= requires("testing")
    extras = {line.removeprefix("Provides-Extra: ") for line in lines if line.startswith("Provides-Extra: ")}
    assert "testing" in extras and not {"test", "dev", "bench"} & extras  # dependency groups, not extras


# -- a plain install, for real -------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv holding effectq without any extra (pydantic is its one dependency)."""
    venv = tmp_path_factory.mktemp("plain") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], check=True, timeout=600
    )
    return venv


def _in(venv: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EFFECTQ_", "PYTEST_", "PYTHON"))}
    return subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=cwd,
    )


@pytest.mark.slow
def test_plain_install_explains_itself(plain_venv: Path, tmp_path: Path) -> None:
    """After `pip install effectq` alone: --version works, a Redis command names the extra to
    install in one line (exit 5), `import effectq` and a memory-store effect work; then, with
    pytest installed, the plugin's fixtures say what to install."""
    version = _in(plain_venv, "effectq", "--version")
    assert version.returncode == 0 and version.stdout.startswith("effectq "), version.stderr
    listed = _in(plain_venv, "effectq", "list")
    assert listed.returncode == Exit.MISSING_EXTRA, listed.stderr
    assert listed.stderr.splitlines() == [
        "effectq: this command needs redis-py, which is not installed: pip install 'effectq[redis]'"
    ]
    used = _in(
        plain_venv,
        "python",
        "-c",
        "import effectq\n"
        "@effectq.effect(name='hello')\n"
        "def hello(to: str) -> str:\n"
        "    return 'hi ' + to\n"
        "with effectq.run('r1', store=effectq.MemoryStore()):\n"
        "    print(hello('ada'), hello('ada'))\n",
    )
    assert used.stdout.strip() == "hi ada hi ada", used.stderr

    subprocess.run(
        [str(plain_venv / "bin" / "python"), "-m", "pip", "install", "-q", "pytest"], check=True, timeout=600
    )
    (tmp_path / "test_user.py").write_text(
        "def test_memory(effectq_store, effectq_run):\n"
        "    pass\n\n"
        "def test_ledger(effectq_ledger):\n"
        "    pass\n"
    )
    tested = _in(plain_venv, "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=tmp_path)
    assert "1 passed, 1 error" in tested.stdout, tested.stdout + tested.stderr
    assert "effectq_ledger needs fakeredis with Lua: pip install 'effectq[testing]'" in tested.stdout
