"""What a chaos run did and found: :class:`Report`, its figures, its rendering and its verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ledger import Application, Verdict
from .options import Options

__all__ = ["Report"]


@dataclass(slots=True)
class Report:
    """What a chaos run did and found.

    Attributes:
        options: the run's options.
        verdict: applications judged against the expected effects.
        kills: SIGKILLs of a whole worker the runner sent (random, or after a grace period ran out).
        child_kills: SIGKILLs of one pool child.
        terms: warm shutdowns (SIGTERM) the runner sent.
        quits: cold shutdowns (SIGQUIT) the runner sent.
        grace_kills: shutdowns that did not end within the grace period, then SIGKILLed.
        deaths: workers that died on their own (an injected kill, a crash) and were restarted.
        pauses: SIGSTOPs of a worker past its lease.
        store_restarts: restarts of the store's redis-server.
        store_pauses: freezes of the store's redis-server past the lease.
        partitions: times one worker's path to the store's Redis was held past the lease.
        cuts: broker connection cuts.
        deliveries: task executions started (a task killed and delivered again counts twice).
        copies: executions that started while another execution of the same task still ran.
        retries: executions that were a retry (``self.retry``, autoretry, effectq's in-flight retry).
        retry_asks: retries the tasks asked for.
        time_limits: executions a time limit interrupted.
        finished: tasks that finished.
        replayed: effects the finishing deliveries replayed from the record.
        reconciled: effects the finishing deliveries found applied by asking the ledger.
        unknown: tasks stopped by an unknown outcome (left for an operator).
        wrong: effects that returned another value than the one they applied.
        fenced: applications the ledger refused (a resumed holder, fenced out).
        resent: tasks sent again after the run stalled (the broker lost their message).
        elapsed: seconds.
        timed_out: the run gave up before every task finished.
        calmed: when the faults stopped to let the last tasks finish (0: they never had to).
        evidence: the ledger's applications of the effects that applied more than once (the
            first 30: key, fencing token, process, time), to tell what happened.
        warnings: what ``effectq doctor`` finds wrong with the store's Redis for the run's faults
            (said before the run starts: a restarted store without persistence loses records).
    """

    options: Options
    verdict: Verdict | None = None
    kills: int = 0
    child_kills: int = 0
    terms: int = 0
    quits: int = 0
    grace_kills: int = 0
    deaths: int = 0
    pauses: int = 0
    store_restarts: int = 0
    store_pauses: int = 0
    partitions: int = 0
    cuts: int = 0
    deliveries: int = 0
    copies: int = 0
    retries: int = 0
    retry_asks: int = 0
    time_limits: int = 0
    finished: int = 0
    replayed: int = 0
    reconciled: int = 0
    unknown: int = 0
    wrong: int = 0
    fenced: int = 0
    resent: int = 0
    elapsed: float = 0.0
    timed_out: bool = False
    calmed: float = 0.0
    logs: str = ""
    tail: dict[str, str] = field(default_factory=dict)
    evidence: list[Application] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    expected: int = 0

    @property
    def redeliveries(self) -> int:
        """Task executions beyond the first of each task."""
        return max(0, self.deliveries - self.finished)

    @property
    def duplicates(self) -> int:
        return self.verdict.extra if self.verdict else 0

    @property
    def callback_duplicates(self) -> int:
        """Applications beyond the first of the chords' callback effects (one per chord)."""
        if self.verdict is None or not self.options.chord:
            return 0
        tasks = self.options.tasks
        return sum(
            n - 1 for identity, n in self.verdict.duplicates.items() if int(identity.split(":")[0]) >= tasks
        )

    @property
    def missing(self) -> int:
        return len(self.verdict.missing) if self.verdict else 0

    @property
    def not_done(self) -> int:
        """Tasks that never finished."""
        return self.options.units - self.finished

    @property
    def harmed(self) -> bool:
        """Whether any effect applied twice or returned a wrong value (the harm a scenario is about)."""
        return bool(self.duplicates or self.wrong)

    @property
    def bit(self) -> bool:
        """Whether the chaos reached the tasks at all (some task was delivered again)."""
        return self.redeliveries > 0

    @property
    def passed(self) -> bool:
        """With effectq: no duplicate, nothing missing or wrong, nothing timed out, and the chaos bit."""
        return not self.timed_out and not self.harmed and self.missing == 0 and self.bit

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data."""
        o = self.options
        return {
            "scenario": o.scenario or o.configuration,
            "configuration": o.configuration,
            "effectq": o.effectq,
            "tasks": o.units,
            "chords": o.chords,
            "finished": self.finished,
            "not_done": self.not_done,
            "effects": self.expected,
            "kills": self.kills,
            "child_kills": self.child_kills,
            "terms": self.terms,
            "quits": self.quits,
            "grace_kills": self.grace_kills,
            "deaths": self.deaths,
            "pauses": self.pauses,
            "store_restarts": self.store_restarts,
            "store_pauses": self.store_pauses,
            "partitions": self.partitions,
            "cuts": self.cuts,
            "redeliveries": self.redeliveries,
            "copies": self.copies,
            "retries": self.retries,
            "retry_asks": self.retry_asks,
            "time_limits": self.time_limits,
            "applications": self.verdict.applications if self.verdict else 0,
            "duplicates": self.duplicates,
            "callback_duplicates": self.callback_duplicates,
            "missing": self.missing,
            "wrong": self.wrong,
            "reconciled": self.reconciled,
            "unknown": self.unknown,
            "replayed": self.replayed,
            "fenced": self.fenced,
            "resent": self.resent,
            "elapsed": round(self.elapsed, 3),
            "timed_out": self.timed_out,
            "conclusion": self.conclusion(),
            "warnings": self.warnings,
            "evidence": [
                {"identity": a.identity, "key": a.idempotency_key, "token": a.token, "pid": a.pid, "at": a.at}
                for a in self.evidence
            ],
        }

    def _faults(self) -> str:
        o = self.options
        faults = []
        if o.kill_every:
            what = {"kill": "SIGKILL", "child": "SIGKILL of a pool child", "term": "SIGTERM",
                    "quit": "SIGQUIT"}  # fmt: skip
            kinds = " / ".join(what.get(k, k) for k in o.kill_with)
            busy = " of a busy worker" if o.target == "busy" else ""
            faults.append(f"{kinds}{busy} every {o.kill_every[0]:g}-{o.kill_every[1]:g}s")
        for name, value in (("store restart every", o.redis_restart), ("SIGSTOP every", o.sigstop),
                            ("store freeze every", o.store_pause),
                            ("partition from the store every", o.partition),
                            ("connection cut every", o.cut)):  # fmt: skip
            if value:
                faults.append(f"{name} {value:g}s")
        for spec, where in ((o.slow, "before"), (o.late, "after")):
            if spec:
                index, seconds, every = [*spec.split(":"), "1"][:3]
                which = "each task" if every == "1" else f"one task in {every}"
                faults.append(f"first run of {which}: {seconds}s in effect {index} {where} its side effect")
        if o.time_limit:
            faults.append(f"time limit {o.time_limit:g}s")
        if o.countdown:
            faults.append(f"countdown {o.countdown:g}s")
        if o.retry_after:
            faults.append(f"retry ({o.retry or 'at once'}) after effect {o.retry_after}")
        if o.configuration.endswith("redis") and (o.visibility or o.slow or o.countdown):
            faults.append(f"visibility {o.broker_visibility:g}s")
        if o.faults:
            faults.append(f"injected {o.faults}")
        if o.reads:
            timeout = f" (its calls give up after {o.reads_timeout:g}s)" if o.reads_timeout else ""
            faults.append(f"each effect reads and writes the store's Redis{timeout}")
        return ", ".join(faults) or "none"

    def render(self) -> str:
        """The report a person reads at a glance."""
        o = self.options
        pools = "" if o.configuration.startswith("dramatiq") or o.pool == "solo" else f", pool {o.pool}"
        idle = f" (+{o.idle_workers} idle)" if o.idle_workers else ""
        title = f"{o.scenario}: " if o.scenario and o.scenario != o.configuration else ""
        chords = f"; {o.chords} chords of {o.chord} header tasks and a callback" if o.chord else ""
        callbacks = ", 1 per chord callback" if o.chord else ""
        per = f"{o.effects} per task{callbacks}" if not o.app else "each one effectq ran, counted by its key"
        rows = [
            (
                "configuration",
                f"{title}{o.configuration}, effectq {'on' if o.effectq else 'OFF'}, "
                f"{o.workers} workers{idle}{pools}",
            ),
            ("faults", self._faults()),
            ("tasks", f"{o.units} ({self.finished} finished, {self.not_done} not done){chords}"),
            ("effects", f"{self.expected} ({per})"),
            (
                "kills",
                f"{self.kills} SIGKILL, {self.child_kills} of a pool child, {self.deaths} died on their own",
            ),
            (
                "shutdowns",
                f"{self.terms} SIGTERM, {self.quits} SIGQUIT, "
                f"{self.grace_kills} SIGKILLed when the {o.grace:g}s grace ran out",
            ),
            (
                "other faults",
                f"{self.pauses} SIGSTOP, {self.store_restarts} store restarts, "
                f"{self.store_pauses} store freezes, {self.partitions} partitions, {self.cuts} cuts",
            ),
            ("redeliveries", f"{self.redeliveries} ({self.deliveries} task executions started)"),
            ("copies", f"{self.copies} executions began while another of the same task still ran"),
            ("retries", f"{self.retries} executions were retries ({self.retry_asks} asked by the tasks)"),
            ("time limits", f"{self.time_limits} executions interrupted by their time limit"),
            ("applications", str(self.verdict.applications if self.verdict else 0)),
            (
                "duplicates",
                str(self.duplicates)
                + (f" ({self.callback_duplicates} of chord callbacks)" if o.chord else ""),
            ),
            ("missing", str(self.missing)),
            ("wrong results", str(self.wrong)),
            ("unknown", f"{self.reconciled} resolved by reconcile, {self.unknown} left for an operator"),
            ("replayed", f"{self.replayed} effects short-circuited by finishing deliveries"),
            ("fenced", f"{self.fenced} late applications refused by the ledger"),
            ("resent", f"{self.resent} tasks the broker lost, sent again under a new task id"),
            (
                "elapsed",
                f"{self.elapsed:.1f}s"
                + (" (TIMED OUT)" if self.timed_out else "")
                + (f", faults stopped at {self.calmed:.0f}s to let the rest finish" if self.calmed else ""),
            ),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"  {k.ljust(width)}  {v}" for k, v in rows]
        if self.evidence:
            first = min(a.at for a in self.evidence)
            lines += ["", "  the ledger's applications of the effects applied more than once:"]
            lines += [
                f"    {a.identity:<8} key={a.idempotency_key or '-'} token={a.token} pid={a.pid} "
                f"at +{a.at - first:.3f}s"
                for a in self.evidence
            ]
        notes = [f"  warning        {w}" for w in self.warnings]
        return "\n".join(["effectq chaos", *notes, *lines, "", self.conclusion()])

    def conclusion(self) -> str:
        o = self.options
        if self.timed_out:
            return f"INCONCLUSIVE: {self.not_done} tasks did not finish in {o.timeout:g}s (logs: {self.logs})"
        if not self.bit:
            return "PROVED NOTHING: no task was delivered twice; the chaos never reached a task"
        harm = f"{self.duplicates} duplicate applications" + (
            f", {self.wrong} wrong results" if self.wrong else ""
        )
        if not o.effectq:
            if self.harmed:
                return f"WITHOUT EFFECTQ: {harm}; the chaos bites"
            return "PROVED NOTHING: without effectq the chaos caused no duplicate; make it harsher"
        if self.duplicates or self.missing:
            warned = "; as warned before the run, the store's Redis lost records" if self.warnings else ""
            return f"FAIL: {self.verdict}" + (f"; {self.wrong} wrong results" if self.wrong else "") + warned
        if self.wrong:
            return f"FAIL: {self.wrong} effects returned another value than the one they applied"
        effects = self.expected
        return f"PASS: {effects} effects, each applied exactly once across {self.redeliveries} redeliveries"
