"""effectq.testing: fixtures, fault injection at each named point, exactly-once verdicts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import pytest

import effectq
from effectq.testing import Action, Crash, Fault, FaultyStore, Ledger, Point, assert_exactly_once, verdict
from effectq.testing.plugin import Delivery, ManualClock

pytest_plugins = ["pytester"]

LEASE = 5.0


@pytest.fixture
def refund(effectq_ledger: Ledger) -> effectq.Effect[[str], str]:
    """An effect applied to the ledger; its reconcile hook asks the ledger."""

    def reconcile(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> str | None:
        return effectq_ledger.lookup(ctx.idempotency_key, token=ctx.token)

    @effectq.effect(name="refund", lease=LEASE, wait=0.2, reconcile=reconcile)
    def refund(order: str) -> str:
        ctx = effectq.current_effect()
        return effectq_ledger.apply(f"refund:{order}", idempotency_key=ctx.idempotency_key, token=ctx.token)

    return refund


def task(refund: Any) -> Callable[[str], str]:
    def process(order: str) -> str:
        try:
            return str(refund(order))
        except Exception:  # user code that swallows errors cannot swallow a simulated crash
            return "swallowed"

    return process


@pytest.mark.parametrize("point", list(Point))
def test_each_fault_point_then_redelivery_applies_once(
    point: Point,
    effectq_store: FaultyStore,
    effectq_deliver: Callable[..., Delivery],
    effectq_ledger: Ledger,
    effectq_clock: ManualClock,
    refund: Any,
) -> None:
    """A crash at any named point, then a redelivery of the same task: the refund applied exactly once."""
    fault = effectq_store.add(Fault(point, effect="refund"))
    first = effectq_deliver(task(refund), "o1", task_id="task-1")
    assert first.crashed
    assert isinstance(first.error, Crash)
    assert first.error.point is point
    assert fault.struck == 1
    effectq_clock.advance(LEASE + 1)  # the dead holder's lease runs out
    second = effectq_deliver(task(refund), "o1", task_id="task-1")
    assert second.error is None
    assert second.value == "refund:o1"
    assert_exactly_once(effectq_ledger, ["refund:o1"])
    applied_before_crash = point in (Point.AFTER_EFFECT, Point.COMPLETION_LOST)
    stats = second.run.stats
    if point is Point.COMPLETION_LOST:
        assert stats.replayed == 1  # the completion had landed
    elif applied_before_crash:
        assert stats.reconciled == 1  # the ledger said it applied
    else:
        assert stats.executed == 1


def test_lost_completion_reply_is_retried_with_the_same_token(
    effectq_store: FaultyStore, effectq_run: effectq.Run, effectq_ledger: Ledger, refund: Any
) -> None:
    """A completion whose reply is lost (a store error after it landed) is retried and holds."""
    effectq_store.add(Fault(Point.COMPLETION_LOST, Action.ERROR))
    assert refund("o2") == "refund:o2"
    assert refund("o2") == "refund:o2"
    assert effectq_run.stats.executed == 1
    assert effectq_run.stats.replayed == 1
    assert_exactly_once(effectq_ledger, ["refund:o2"])


def test_store_error_before_claim_fails_closed(
    effectq_store: FaultyStore, effectq_run: effectq.Run, effectq_ledger: Ledger, refund: Any
) -> None:
    """A store that keeps failing before the claim: the effect raises StoreError and nothing applied."""
    fault = effectq_store.add(Fault(Point.BEFORE_CLAIM, Action.ERROR, times=None))
    with pytest.raises(effectq.StoreError):
        refund("o3")
    assert fault.struck == 3  # the engine retried the claim, then failed closed
    assert effectq_ledger.counts() == {}


def test_one_failed_claim_round_trip_is_retried(
    effectq_store: FaultyStore, effectq_run: effectq.Run, effectq_ledger: Ledger, refund: Any
) -> None:
    """One store error before the claim: the engine retries the claim and the effect applies once."""
    effectq_store.add(Fault(Point.BEFORE_CLAIM, Action.ERROR))
    assert refund("o4") == "refund:o4"
    assert_exactly_once(effectq_ledger, ["refund:o4"])


def test_faults_match_by_effect_name_and_probability(
    effectq_store: FaultyStore, effectq_run: effectq.Run
) -> None:
    """A fault for another effect never strikes; probability 0 never strikes; times bounds the strikes."""
    other = effectq_store.add(Fault(Point.AFTER_EFFECT, effect="other"))
    never = effectq_store.add(Fault(Point.AFTER_EFFECT, probability=0.0, times=None))

    @effectq.effect(name="noop")
    def noop(i: int) -> int:
        return i

    assert [noop(i) for i in range(5)] == list(range(5))
    assert (other.struck, never.struck) == (0, 0)


def test_kill_action_is_a_real_sigkill(tmp_path: Any) -> None:
    """Action.KILL kills the process itself with SIGKILL, after the side effect and before its record."""
    script = textwrap.dedent(
        """
        import effectq
        from effectq.testing import Action, Fault, FaultyStore, Point
        store = FaultyStore(effectq.MemoryStore(), [Fault(Point.AFTER_EFFECT, Action.KILL)])

        @effectq.effect(name="mail")
        def mail() -> None:
            print("applied", flush=True)

        with effectq.run("r", store=store):
            mail()
        print("survived", flush=True)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9
    assert done.stdout.split() == ["applied"]


def test_verdict_names_duplicates_missing_and_unexpected() -> None:
    """The verdict counts what went wrong; assert_exactly_once fails with it."""
    result = verdict({"a": 1, "b": 3, "x": 1}, ["a", "b", "c"])
    assert not result.ok
    assert dict(result.duplicates) == {"b": 3}
    assert result.extra == 2
    assert result.missing == ("c",)
    assert result.unexpected == ("x",)
    with pytest.raises(AssertionError, match="applied more than once"):
        assert_exactly_once({"a": 2}, ["a"])
    assert assert_exactly_once({"a": 1}, ["a"]).ok


def test_ledger_fence_refuses_a_resumed_holder(effectq_ledger: Ledger) -> None:
    """After a later holder looked (token 5), an application with an older token (3) is refused."""
    assert effectq_ledger.lookup("k", token=5) is None
    with pytest.raises(Exception, match="fenced by token 5"):
        effectq_ledger.apply("e", idempotency_key="k", token=3)
    assert effectq_ledger.apply("e", idempotency_key="k", token=5) == "e"
    assert effectq_ledger.lookup("k", token=6) == "e"


def test_plugin_fixtures_in_a_user_suite(pytester: pytest.Pytester) -> None:
    """A user's suite gets the fixtures from the entry point, with each store kind."""
    pytester.makepyfile(
        """
        import effectq
        from effectq.testing import Fault, Point, assert_exactly_once

        def test_redelivered_task(effectq_store, effectq_deliver, effectq_ledger, effectq_clock):
            @effectq.effect(name="mail", lease=1,
                            reconcile=lambda key, args, ctx: effectq_ledger.lookup(ctx.idempotency_key))
            def mail(to):
                key = effectq.current_effect().idempotency_key
                return effectq_ledger.apply("mail:" + to, idempotency_key=key)

            effectq_store.add(Fault(Point.AFTER_EFFECT, effect="mail"))
            assert effectq_deliver(mail, "ada", task_id="t1").crashed
            effectq_clock.advance(1.5)
            assert effectq_deliver(mail, "ada", task_id="t1").value == "mail:ada"
            assert_exactly_once(effectq_ledger, ["mail:ada"])

        def test_run(effectq_run):
            assert effectq.current_run() is effectq_run
        """
    )
    for kind in ("memory", "fakeredis"):
        result = pytester.runpytest_subprocess(f"--effectq-store={kind}", "-p", "no:cacheprovider")
        result.assert_outcomes(passed=2)
