"""``effectq doctor``: run the deployment checks and say how to fix what fails."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import asdict

from ..ops.doctor import Level, diagnose
from .output import safe_url
from .session import CommandError, Exit, Session

__all__ = ["run_doctor"]

_MARK = {Level.OK: "ok", Level.WARN: "WARN", Level.FAIL: "FAIL", Level.SKIP: "skip"}


def _wait_replicas(session: Session) -> int:
    given = session.args.wait_replicas
    text = str(given) if given is not None else os.environ.get("EFFECTQ_WAIT_REPLICAS") or "0"
    if not text.isdigit():
        raise CommandError(f"--wait-replicas must be a whole number of replicas, not {text!r}", Exit.USAGE)
    return int(text)


def run_doctor(session: Session) -> Exit:
    store = session.store()
    store.client.ping()  # unreachable: exit 4, like every command
    findings = diagnose(store, wait_replicas=_wait_replicas(session))
    levels = Counter(f.level for f in findings)
    code = Exit.FAILED if levels[Level.FAIL] else Exit.OK
    if session.json:
        session.emit(
            {
                "url": safe_url(session.url),
                "namespace": store.namespace,
                "ok": code is Exit.OK,
                "findings": [{**asdict(f), "level": f.level.value} for f in findings],
            }
        )
        return code
    session.say(f"effectq doctor: {safe_url(session.url)} (namespace {store.namespace})")
    width = max(len(f.check) for f in findings)
    for f in findings:
        where = f" [{f.node}]" if f.node and len({x.node for x in findings if x.node}) > 1 else ""
        session.say(f"  {_MARK[f.level]:<4}  {f.check.ljust(width)}  {f.summary}{where}")
        if f.fix and f.level is not Level.OK:
            session.say(f"  {'':<4}  {'':<{width}}  fix: {f.fix}")
    session.say(
        f"{levels[Level.FAIL]} failing, {levels[Level.WARN]} warning(s)"
        + (f", {levels[Level.SKIP]} not checked" if levels[Level.SKIP] else "")
    )
    return code
