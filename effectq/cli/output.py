"""How the command line shows things: ages, tables, records as JSON, URLs without passwords."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:  # the functions that need them at run time import them: --help loads no store
    from ..store.base import Record
    from ..store.operators import Standing

__all__ = [
    "age",
    "duration_arg",
    "holder",
    "parse_duration",
    "record_json",
    "result_summary",
    "safe_url",
    "stamp",
    "table",
]

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str) -> float:
    """Seconds in ``10m``, ``1h30m``, ``7d``, ``500ms`` or plain ``90`` (seconds)."""
    text = text.strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (write e.g. 90s, 10m, 2h, 7d)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def duration_arg(text: str) -> float:
    """:func:`parse_duration` for argparse (a bad duration is a usage error)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def age(seconds: float | None) -> str:
    """``45s``, ``12m03s``, ``5h12m``, ``3d04h``: two units at most."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def stamp(when: datetime | None) -> str:
    """A UTC time to the second, or ``-``."""
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is never padded."""
    widths = [max(len(str(row[i])) for row in (header, *rows)) for i in range(len(header) - 1)]
    lines = []
    for row in (header, *rows):
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return "\n".join(lines)


def safe_url(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, f"{user}:***@{host}{port}", parts.path, parts.query, parts.fragment))


def holder(owner: str) -> tuple[str, int | None]:
    """The host and pid of an owner id (``host:pid:n``)."""
    parts = owner.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1])
    return owner, None


def result_summary(record: Record) -> str:
    """What is known of the result, never the result itself."""
    from ..store.base import ResultState, Status

    if record.status is not Status.COMPLETED:
        return "-"
    if record.result_state is ResultState.STORED:
        return f"{len(record.result or b'')} bytes"
    return f"not recorded ({record.result_state.value})"


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).isoformat()


def record_json(
    record: Record, where: Standing, since: datetime | None, now: datetime, namespace: str
) -> dict[str, Any]:
    """A record as JSON-ready data; the result body only as its size."""
    from ..keys import idempotency_key

    host, pid = holder(record.owner) if record.owner else ("", None)
    return {
        "key": record.key,
        "standing": where.value,
        "status": record.status.value,
        "name": record.name,
        "run_id": record.run_id,
        "attempt": record.attempt,
        "token": record.token,
        "owner": record.owner,
        "holder_host": host or None,
        "holder_pid": pid,
        "lease_expires_at": _iso(record.lease_expires_at),
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "since": _iso(since),
        "age_seconds": None if since is None else round(max(0.0, (now - since).total_seconds()), 3),
        "error": record.error,
        "result_state": record.result_state.value or "stored",
        "result_bytes": len(record.result) if record.result is not None else None,
        "input_hash": record.input_hash,
        "expires_at": _iso(record.expires_at),
        "idempotency_key": idempotency_key(namespace, record.key),
    }
