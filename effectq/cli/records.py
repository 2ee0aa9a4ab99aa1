"""``effectq list``, ``show`` and ``resolve``: find what is in doubt, read it, settle it."""

from __future__ import annotations

import argparse
import os
import socket

from ..errors import ConfigurationError, ResolveRefusedError
from ..keys import idempotency_key
from ..ops import admin
from ..store.base import Record, Status
from ..store.operators import Standing, since, standing
from .output import age, holder, record_json, result_summary, stamp, table
from .session import CommandError, Exit, Session

__all__ = ["run_list", "run_resolve", "run_show"]


def _standings(args: argparse.Namespace) -> set[Standing]:
    chosen = args.status or (["all"] if args.run is not None else [])
    if not chosen:
        return set(admin.INDEXED)
    if "all" in chosen:
        return set(Standing)
    return {Standing(value) for value in chosen}


def _detail(record: Record, where: Standing) -> str:
    if where is Standing.IN_FLIGHT:
        return f"held by {record.owner}"
    if where is Standing.COMPLETED:
        return result_summary(record)
    if record.status is Status.PENDING:
        return f"never ran: holder {record.owner} died while pending"
    text = record.error or (f"holder {record.owner} went silent" if record.owner else "")
    if where is Standing.FAILED:
        text = ("terminal: " if record.failure else f"parked after {record.attempt} attempts: ") + text
    return text if len(text) <= 80 else text[:79] + "…"


def run_list(session: Session) -> Exit:
    args = session.args
    store = session.store()
    limit = args.limit or None
    order = list(Standing)
    entries = sorted(
        admin.list_records(
            store,
            standings=_standings(args),
            run_id=args.run,
            name=args.name,
            older_than=args.older_than,
            limit=limit,
        ),
        key=lambda e: (order.index(e.standing), e.since or e.now),
    )
    if session.json:
        session.emit([record_json(e.record, e.standing, e.since, e.now, store.namespace) for e in entries])
        return Exit.OK
    if not entries:
        session.note(f"no matching records in namespace {store.namespace!r}")
        return Exit.OK
    rows = [
        [
            e.standing.value,
            age(e.age),
            e.record.name,
            str(e.record.attempt),
            e.record.run_id,
            e.record.key,
            _detail(e.record, e.standing),
        ]
        for e in entries
    ]
    session.say(table(["STATUS", "AGE", "EFFECT", "ATTEMPT", "RUN", "KEY", "DETAIL"], rows))
    if limit is not None and len(entries) == limit:
        session.note(f"(first {limit}; --limit 0 for all)")
    if any(e.standing is Standing.FAILED for e in entries):
        session.note("reset one (the next call runs it again): effectq resolve KEY --not-applied")
    if any(e.standing is Standing.UNKNOWN for e in entries):
        session.note(
            "settle one: effectq show KEY, check the remote system, then "
            "effectq resolve KEY --applied | --not-applied"
        )
    return Exit.OK


def _missing(session: Session, key: str) -> CommandError:
    return CommandError(
        f"no record for key {key!r} in namespace {session.namespace!r} (expired, purged, never claimed, "
        f"or another --namespace)",
        Exit.NOT_FOUND,
        key=key,
    )


def run_show(session: Session) -> Exit:
    store = session.store()
    key = session.args.key
    record = store.get(key)
    if record is None:
        raise _missing(session, key)
    now = store.clock()
    where = standing(record, now)
    when = since(record, where)
    if session.json:
        data = record_json(record, where, when, now, store.namespace)
        if session.args.result and record.result is not None:
            data["result"] = record.result.decode("utf-8", "replace")
        session.emit(data)
        return Exit.OK
    elapsed = None if when is None else (now - when).total_seconds()
    lines = [
        ("key", record.key),
        ("status", _status_line(record, where)),
        ("effect", record.name or "-"),
        ("run", record.run_id or "-"),
        ("attempts", str(record.attempt)),
        ("since", f"{stamp(when)} ({age(elapsed)} ago)"),
    ]
    if record.owner:
        lines.append(("holder", _holder_line(record, where)))
    if record.lease_expires_at is not None:
        ran_out = record.lease_expires_at <= now
        lines.append(("lease ran out" if ran_out else "lease until", stamp(record.lease_expires_at)))
    if record.error:
        label = "error" if record.status is Status.RELEASED else "note"
        if where is Standing.UNKNOWN:
            label = "why unknown"
        if where is Standing.FAILED:
            label = "last error"
        lines.append((label, record.error))
    if record.failure:
        lines.append(("recorded exception", record.failure))
    lines += [
        ("result", result_summary(record)),
        ("created", stamp(record.created_at)),
        ("updated", stamp(record.updated_at)),
        ("expires", stamp(record.expires_at) if record.expires_at else "never (until settled)"),
        ("input hash", record.input_hash or "-"),
        ("idempotency key", idempotency_key(store.namespace, record.key)),
        ("token", str(record.token)),
    ]
    width = max(len(label) for label, _ in lines)
    for label, value in lines:
        session.say(f"{label.ljust(width)}  {value}")
    if session.args.result and record.result is not None:
        session.say()
        session.say(record.result.decode("utf-8", "replace"))
    if where is Standing.FAILED:
        session.say()
        session.say("Every call raises again without running. To run it again (its attempts start from 0):")
        session.say(f"  effectq resolve {_quote(record.key)} --not-applied")
    if where is Standing.UNKNOWN:
        session.say()
        session.say(
            "This effect may have applied. Check the remote system (search it for the idempotency key"
        )
        session.say("or the effect's marker), then settle it:")
        session.say(f"  effectq resolve {_quote(record.key)} --applied [--result JSON]")
        session.say(f"  effectq resolve {_quote(record.key)} --not-applied")
    return Exit.OK


def _status_line(record: Record, where: Standing) -> str:
    if where is Standing.UNKNOWN and record.status is Status.DISPATCHED:
        return "unknown: dispatched, and its holder's lease ran out (the holder died or hung)"
    if where is Standing.UNKNOWN:
        held = " (a reconcile holds it now)" if record.lease_expires_at else ""
        return f"unknown: may have applied; never re-run until settled{held}"
    if where is Standing.RELEASED and record.status is Status.PENDING:
        return "released: pending, and its holder died before running it; the next call applies it"
    return {
        Standing.IN_FLIGHT: f"in flight ({record.status.value}, lease live)",
        Standing.COMPLETED: "completed: applied; later calls replay the result",
        Standing.RELEASED: "released: not applied; the next call applies it",
        Standing.FAILED: "failed: " + _failed_detail(record),
    }.get(where, where.value)


def _failed_detail(record: Record) -> str:
    if record.failure:
        return "a terminal exception, raised again by every call"
    return f"parked after {record.attempt} attempts; every call raises AttemptsExhausted"


def _holder_line(record: Record, where: Standing) -> str:
    host, pid = holder(record.owner)
    text = f"{record.owner} (host {host}, pid {pid if pid is not None else '?'})"
    if pid is not None and host == socket.gethostname():
        text += "; that process is " + ("running" if _alive(pid) else "not running") + " on this host"
    elif where is Standing.UNKNOWN and record.status is Status.DISPATCHED:
        text += "; it stopped renewing its lease"
    return text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _quote(key: str) -> str:
    return "'" + key.replace("'", "'\\''") + "'"


def run_resolve(session: Session) -> Exit:
    args = session.args
    store = session.store()
    try:
        before, after = admin.resolve(
            store,
            args.key,
            applied=args.applied,
            result=args.result,
            note=args.note,
            retention=admin.DEFAULT_RETENTION if args.retention is None else args.retention,
        )
    except ConfigurationError as exc:
        raise CommandError(str(exc), Exit.USAGE) from exc
    except ResolveRefusedError as exc:
        if exc.status is None:
            raise _missing(session, args.key) from exc
        raise CommandError(str(exc), Exit.FAILED, key=args.key, status=exc.status) from exc
    now = store.clock()
    if session.json:
        session.emit(
            {
                "key": args.key,
                "resolved": "applied" if args.applied else "not_applied",
                "before": None
                if before is None
                else record_json(before, standing(before, now), None, now, store.namespace),
                "after": record_json(
                    after, standing(after, now), since(after, standing(after, now)), now, store.namespace
                ),
            }
        )
        return Exit.OK
    was = f" (was {before.status.value}: {before.error})" if before is not None and before.error else ""
    if args.applied:
        replay = "the result given" if args.result is not None else "ResultNotRecordedError (no result given)"
        session.say(f"settled {args.key} as applied{was}; later calls get {replay}, never a re-run")
    else:
        session.say(f"settled {args.key} as not applied{was}; the next call applies the effect")
    return Exit.OK
