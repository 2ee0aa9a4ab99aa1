"""The ``effectq`` command line, for operators.

    effectq list [--status unknown|in-flight|completed|released|failed|all] [--run RUN_ID] [--name EFFECT]
                 [--older-than 10m]
    effectq show KEY
    effectq resolve KEY --applied [--result JSON] | --not-applied
    effectq stats [--no-scan]
    effectq purge --run RUN_ID | --older-than 30d [--yes]
    effectq doctor
    effectq chaos ...            (the crash-test harness, when installed)
    effectq --version

Every command takes ``--url`` (or ``EFFECTQ_URL``), ``--namespace`` (or
``EFFECTQ_NAMESPACE``) and ``--json``. Exit codes are :class:`Exit`: 0 done,
1 the answer is no (doctor failed, resolve refused), 2 usage, 3 no such
record, 4 Redis unreachable, 5 an extra the command needs is not installed
(one line naming it). No traceback for an operator's mistake; ``-v`` shows
logs, ``-vv`` tracebacks too.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import IO

from .. import __version__
from ..errors import ConfigurationError, StoreError
from . import commands
from .output import safe_url
from .session import CommandError, Exit, Session

__all__ = ["Exit", "main"]

log = logging.getLogger("effectq.cli")

_GLOBAL_WITH_VALUE = ("--url", "--namespace", "-n", "--prefix")

_EXTRAS = {
    "redis": ("redis-py", "redis"),
    "fakeredis": ("fakeredis", "embedded"),
    "lupa": ("lupa", "embedded"),
    "celery": ("Celery", "celery"),
    "kombu": ("Celery", "celery"),
    "dramatiq": ("Dramatiq", "dramatiq"),
    "pika": ("pika", "dramatiq-rabbitmq"),
}
"""The packages a command may need that come with an extra: module -> (what it is, the extra)."""


def _common() -> argparse.ArgumentParser:
    """Options every command takes, before or after its name (SUPPRESS: a later default never wins)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("connection and output")
    group.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help="redis:// URL (default: $EFFECTQ_URL, else redis://127.0.0.1:6379/0)",
    )
    group.add_argument(
        "--namespace",
        "-n",
        default=argparse.SUPPRESS,
        help="the effects' namespace (default: $EFFECTQ_NAMESPACE, else 'default')",
    )
    group.add_argument("--prefix", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    group.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=argparse.SUPPRESS,
        help="log to stderr (-vv: debug, with tracebacks)",
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="effectq",
        parents=[common],
        description="Inspect and settle effectq's effect records; check the Redis they live in.",
        epilog="exit codes: 0 done, 1 refused or failing check, 2 usage, 3 no such record, "
        "4 Redis unreachable, 5 an extra is not installed",
    )
    parser.add_argument("--version", action="version", version=f"effectq {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.register(subparsers, common)
    subparsers.add_parser(
        "chaos", help="crash-test harness (effectq.chaos): effectq chaos --help", add_help=False
    )
    return parser


def _chaos_args(argv: Sequence[str]) -> list[str] | None:
    """The arguments after ``chaos`` when that is the command (global options before it are passed on)."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "chaos":
            return [*argv[:i], *argv[i + 1 :]]
        if word in _GLOBAL_WITH_VALUE:
            i += 2
        elif word.startswith("-"):
            i += 1
        else:
            return None
    return None


def _chaos(rest: list[str], err: IO[str]) -> int:
    try:
        module = importlib.import_module("effectq.chaos")
    except ModuleNotFoundError as exc:
        if exc.name not in ("effectq.chaos", "effectq"):
            raise
        print("effectq: the chaos harness (module effectq.chaos) is not part of this installation", file=err)
        return Exit.USAGE
    run: Callable[[list[str]], int | None] = module.main
    try:
        return int(run(rest) or 0)
    except ImportError as exc:
        missing = missing_extra(exc)
        if missing is None:
            raise
        print(f"effectq: {missing[0]}", file=err)
        return Exit.MISSING_EXTRA


def missing_extra(exc: ImportError) -> tuple[str, str] | None:
    """``(message, extra)`` when ``exc`` (or what caused it) is a package of an extra not installed."""
    seen: BaseException | None = exc
    while seen is not None:
        name = seen.name if isinstance(seen, ModuleNotFoundError) else None
        known = _EXTRAS.get(name or "")  # the package itself: a submodule missing is no missing extra
        if known is not None:
            what, extra = known
            return f"this command needs {what}, which is not installed: pip install 'effectq[{extra}]'", extra
        seen = seen.__cause__ or seen.__context__
    return None


def _logging(verbosity: int) -> Callable[[], None]:
    """effectq's warnings on stderr while the command runs (``-v``: info, ``-vv``: debug)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("effectq: %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("effectq")
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbosity > 1 else logging.INFO if verbosity else logging.WARNING)

    def restore() -> None:
        root.removeHandler(handler)
        root.setLevel(level)

    return restore


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``effectq`` command; returns its exit code (see :class:`Exit`)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    chaos = _chaos_args(args_list)
    if chaos is not None:
        return _chaos(chaos, sys.stderr)
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as stop:  # argparse: --help (0) or a usage error (2), already printed
        return int(stop.code or 0)
    verbosity = int(getattr(args, "verbose", 0) or 0)
    restore_logging = _logging(verbosity)
    session = Session(args)
    try:
        return int(commands.handler(args.handler)(session))
    except CommandError as exc:
        return _fail(session, str(exc), exc.code, exc.details)
    except ConfigurationError as exc:
        return _fail(session, str(exc), Exit.USAGE, {})
    except ImportError as exc:
        missing = missing_extra(exc)
        if missing is None:
            raise
        message, extra = missing
        return _fail(session, message, Exit.MISSING_EXTRA, {"extra": extra})
    except Exception as exc:
        cause = exc.__cause__ if isinstance(exc, StoreError) and exc.__cause__ is not None else exc
        if not isinstance(exc, StoreError) and not _is_redis_error(exc):
            raise
        if verbosity > 1:
            log.exception("effectq %s failed", args.command)
        what = "cannot reach Redis" if _is_redis_error(cause, connection=True) else "Redis failed"
        return _fail(session, f"{what} at {safe_url(session.url)}: {cause}", Exit.UNREACHABLE, {})
    except KeyboardInterrupt:
        return 130
    finally:
        session.close()
        restore_logging()


def _is_redis_error(exc: BaseException, *, connection: bool = False) -> bool:
    try:
        import redis
    except ImportError:  # pragma: no cover - the CLI needs redis-py anyway
        return False
    if connection:
        return isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError)
    return isinstance(exc, redis.RedisError | OSError)


def _fail(session: Session, message: str, code: Exit, details: dict[str, object]) -> int:
    print(f"effectq: {message}", file=session.err)
    if session.json:
        session.emit({"error": message, "exit": int(code), **details})
    return int(code)
