"""What every command shares: exit codes, the store it talks to, and how it prints."""

from __future__ import annotations

import argparse
import enum
import json
import os
import sys
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..store.redis import RedisStore

__all__ = ["DEFAULT_URL", "CommandError", "Exit", "Session"]

DEFAULT_URL = "redis://127.0.0.1:6379/0"


class Exit(enum.IntEnum):
    """The exit codes of ``effectq``."""

    OK = 0
    """Done (a listing may be empty; doctor found nothing failing)."""
    FAILED = 1
    """The command ran and the answer is no: doctor found a failing check, a resolve was refused."""
    USAGE = 2
    """The command line is wrong (unknown option, bad duration, result that is not JSON)."""
    NOT_FOUND = 3
    """No record for that key."""
    UNREACHABLE = 4
    """Redis could not be reached or answered with an error."""
    MISSING_EXTRA = 5
    """The command needs a package that is not installed (``pip install 'effectq[redis]'``)."""


class CommandError(Exception):
    """Ends a command with a message and an exit code (no traceback)."""

    def __init__(self, message: str, code: Exit, **details: Any) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


@dataclass
class Session:
    """One invocation: its options, its store (opened on first use) and its output streams."""

    args: argparse.Namespace
    out: IO[str] = field(default_factory=lambda: sys.stdout)
    err: IO[str] = field(default_factory=lambda: sys.stderr)
    _store: RedisStore | None = None

    @property
    def url(self) -> str:
        return str(getattr(self.args, "url", None) or os.environ.get("EFFECTQ_URL") or DEFAULT_URL)

    @property
    def namespace(self) -> str:
        return str(getattr(self.args, "namespace", None) or os.environ.get("EFFECTQ_NAMESPACE") or "default")

    @property
    def prefix(self) -> str:
        return str(getattr(self.args, "prefix", None) or os.environ.get("EFFECTQ_PREFIX") or "effectq")

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    def store(self) -> RedisStore:
        """The store at ``--url`` / ``EFFECTQ_URL``, in ``--namespace``."""
        if self._store is None:
            from ..store.redis import RedisStore

            try:
                self._store = RedisStore.from_url(self.url, namespace=self.namespace, prefix=self.prefix)
            except ValueError as exc:  # redis-py: a URL it cannot parse
                raise CommandError(f"cannot use --url: {exc}", Exit.USAGE) from exc
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store.client.close()

    def emit(self, data: Any) -> None:
        """Print JSON (``--json``)."""
        print(json.dumps(data, indent=2, default=str, ensure_ascii=False), file=self.out)

    def say(self, text: str = "") -> None:
        """Print for people."""
        print(text, file=self.out)

    def note(self, text: str) -> None:
        """A remark on stderr (never mixed into output a script reads)."""
        print(text, file=self.err)
