"""``effectq stats`` and ``effectq purge``: how much of what, and clearing out settled records."""

from __future__ import annotations

from ..ops import admin
from ..store.operators import Standing
from .output import age, stamp, table
from .session import CommandError, Exit, Session

__all__ = ["run_purge", "run_stats"]

_ORDER = (Standing.UNKNOWN, Standing.IN_FLIGHT, Standing.COMPLETED, Standing.RELEASED, Standing.FAILED)


def run_stats(session: Session) -> Exit:
    store = session.store()
    found = admin.stats(store, scan=not session.args.no_scan)
    shown = _ORDER if found.scanned else _ORDER[:2]
    if session.json:
        session.emit(
            {
                "namespace": found.namespace,
                "now": found.now.isoformat(),
                "scanned": found.scanned,
                "counts": {s.value: found.counts[s] for s in shown},
                "oldest_unknown_since": found.oldest_unknown.isoformat() if found.oldest_unknown else None,
                "oldest_unknown_age_seconds": found.oldest_unknown_age,
                "by_effect": {
                    name: {
                        **{s.value: counts[s] for s in shown},
                        "oldest_unknown_since": found.oldest_by_name[name].isoformat()
                        if name in found.oldest_by_name
                        else None,
                    }
                    for name, counts in sorted(found.by_name.items())
                },
            }
        )
        return Exit.OK
    session.say(f"namespace {found.namespace}  at {stamp(found.now)}")
    for where in shown:
        extra = ""
        if where is Standing.UNKNOWN and found.oldest_unknown is not None:
            extra = f"   oldest {age(found.oldest_unknown_age)} (since {stamp(found.oldest_unknown)})"
        session.say(f"  {where.value:<10} {found.counts[where]:>8}{extra}")
    if not found.scanned:
        session.say("  (completed and released not counted: --no-scan)")
    if found.by_name:
        session.say()
        rows = []
        for name, counts in sorted(found.by_name.items()):
            oldest = found.oldest_by_name.get(name)
            oldest_age = None if oldest is None else (found.now - oldest).total_seconds()
            rows.append([name, *(str(counts[s]) for s in shown), age(oldest_age)])
        session.say(table(["EFFECT", *(s.value.upper() for s in shown), "OLDEST UNKNOWN"], rows))
    return Exit.OK


def run_purge(session: Session) -> Exit:
    args = session.args
    if args.run is None and args.older_than is None:
        raise CommandError(
            "purge needs --run RUN_ID or --older-than AGE (it never empties a namespace)", Exit.USAGE
        )
    store = session.store()
    report = admin.purge(store, run_id=args.run, older_than=args.older_than, dry_run=not args.yes)
    if session.json:
        session.emit(
            {
                "dry_run": report.dry_run,
                "deleted": report.deleted,
                "deleted_by_status": {s.value: n for s, n in report.by_standing.items()},
                "kept": {s.value: n for s, n in report.kept.items()},
                "changed_meanwhile": report.changed,
                "index_entries_pruned": report.pruned,
            }
        )
        return Exit.OK
    parts = ", ".join(f"{n} {s.value}" for s, n in sorted(report.by_standing.items())) or "nothing"
    verb = "would delete" if report.dry_run else "deleted"
    session.say(f"{verb} {report.deleted} records ({parts})")
    kept = sum(report.kept.values())
    if kept:
        detail = ", ".join(f"{n} {s.value}" for s, n in sorted(report.kept.items()))
        session.say(f"kept {kept} that matched but are not settled ({detail}); purge never deletes those")
    if report.changed:
        session.say(f"kept {report.changed} that changed while purging (claimed again)")
    if report.pruned:
        session.say(f"dropped {report.pruned} index entries of records already gone")
    if report.dry_run and report.deleted:
        session.note("dry run: add --yes to delete")
    return Exit.OK
