"""Every store agrees with one reference model of the state machine (hypothesis, stateful).

The model is the protocol written as plainly as possible; hypothesis drives a
store and the model with the same random operations (claims with every flag and an attempts
cap or none, completes, releases, unknowns, terminal failures, dispatches, renewals and
resolves, with live, short and stale tokens) and checks every reply and the record after each
step.
Short leases (1 ms) are followed by a pause, so they have run out by the next
step, whatever the store's clock.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import effectq
from effectq.errors import ResolveRefusedError
from effectq.store.base import ClaimKind, ClaimRequest, ResultState, Status
from tests.conftest import REDIS_URL, delete_namespace

LONG, SHORT = 60_000, 1
KEY = "model-run:model.effect:0"


@dataclass
class Model:
    status: Status | None = None
    token: int = 0
    attempt: int = 0
    lease: str = "none"  # none | live | expired
    owner: str = ""
    input_hash: str = ""
    reconciler_hash: str = ""  # the input hash of a reconcile lease's holder on an unknown
    released_by: str = ""  # "release" or "resolve", for a released record
    result: bytes | None = None
    result_state: ResultState = ResultState.STORED


def lease_after(ms: int) -> str:
    return "live" if ms == LONG else "expired"


class StoreMachine(RuleBasedStateMachine):
    """Drives one store; subclasses say which."""

    def make_store(self, namespace: str) -> effectq.Store:
        raise NotImplementedError

    def cleanup(self, namespace: str) -> None:
        pass

    @initialize()
    def setup(self) -> None:
        self.namespace = f"m{uuid.uuid4().hex[:12]}"
        self.store = self.make_store(self.namespace)
        self.model = Model()
        self.short_used = False

    def teardown(self) -> None:
        if hasattr(self, "namespace"):
            self.cleanup(self.namespace)

    def _after(self, lease_ms: int) -> None:
        if lease_ms == SHORT:
            time.sleep(0.004)

    def _token(self, which: str) -> int:
        return {"current": self.model.token, "stale": self.model.token - 1, "future": self.model.token + 1}[
            which
        ]

    # -- claim ---------------------------------------------------------------------------

    @rule(
        owner=st.sampled_from(["o1", "o2", "o3"]),
        lease_ms=st.sampled_from([LONG, SHORT]),
        can_reconcile=st.booleans(),
        replay_safe=st.booleans(),
        reconcile_first=st.booleans(),
        input_hash=st.sampled_from(["", "h1", "h2"]),
        cap=st.sampled_from([0, 1, 2]),
    )
    def claim(
        self,
        owner: str,
        lease_ms: int,
        can_reconcile: bool,
        replay_safe: bool,
        reconcile_first: bool,
        input_hash: str,
        cap: int,
    ) -> None:
        reconcile_first = reconcile_first and can_reconcile
        request = ClaimRequest(
            lease_ms=lease_ms,
            owner=owner,
            name="model.effect",
            run_id="model-run",
            input_hash=input_hash,
            can_reconcile=can_reconcile,
            replay_safe=replay_safe,
            reconcile_first=reconcile_first,
            retention_ms=LONG,
            max_attempts=cap,
        )
        got = self.store.claim(KEY, request)
        m = self.model
        expected_kind: ClaimKind

        def park() -> ClaimKind:  # the execution would be past the cap
            m.token += 1
            m.status, m.lease, m.owner = Status.FAILED, "none", ""
            return ClaimKind.FAILED

        def grant(fresh: bool) -> ClaimKind:
            if not fresh and not reconcile_first and 0 < cap <= m.attempt:
                return park()
            if fresh:
                assert got.token > 0
                m.token = got.token
            else:
                m.token += 1
            if reconcile_first:
                m.status = Status.PENDING
            else:
                m.status = Status.DISPATCHED
                m.attempt += 1
            m.lease, m.owner, m.input_hash = lease_after(lease_ms), owner, input_hash
            m.result, m.result_state = None, ResultState.STORED
            return ClaimKind.RECONCILE if reconcile_first else ClaimKind.CLAIMED

        if m.status is None:
            expected_kind = grant(fresh=True)
        elif m.status is Status.COMPLETED:
            expected_kind = ClaimKind.COMPLETED
            assert got.result == m.result
            assert got.result_state is m.result_state
            assert got.input_hash == m.input_hash
        elif m.status is Status.RELEASED:
            expected_kind = grant(fresh=False)
        elif m.status is Status.FAILED:
            expected_kind = ClaimKind.FAILED
        elif m.lease != "none" and m.owner == owner:  # a retried claim: its grant, a lease from now
            m.lease = lease_after(lease_ms)
            expected_kind = ClaimKind.CLAIMED if m.status is Status.DISPATCHED else ClaimKind.RECONCILE
        elif m.status is Status.PENDING and m.lease == "live":
            expected_kind = ClaimKind.IN_FLIGHT
        elif m.status is Status.PENDING:
            expected_kind = grant(fresh=False)
        elif m.status is Status.DISPATCHED and m.lease == "live":
            expected_kind = ClaimKind.IN_FLIGHT
        else:
            if m.status is Status.DISPATCHED:  # the holder went silent: unknown
                m.status, m.lease = Status.UNKNOWN, "none"
                assert "lease expired" in got.error
            if m.lease == "live":
                expected_kind = ClaimKind.IN_FLIGHT
            elif can_reconcile:  # asks about the recorded attempt, whose identity the record keeps
                m.token += 1
                m.lease, m.owner, m.reconciler_hash = lease_after(lease_ms), owner, input_hash
                expected_kind = ClaimKind.RECONCILE
                assert got.input_hash == m.input_hash, (got, m)
            elif replay_safe and 0 < cap <= m.attempt:
                expected_kind = park()
            elif replay_safe:  # the re-run executes: it owns the record
                m.token += 1
                m.attempt += 1
                m.status, m.lease, m.owner = Status.DISPATCHED, lease_after(lease_ms), owner
                m.input_hash = input_hash
                expected_kind = ClaimKind.CLAIMED
            else:
                expected_kind = ClaimKind.UNKNOWN
        assert got.kind is expected_kind, (got, m)
        assert got.token == m.token, (got, m)
        assert got.attempt == m.attempt, (got, m)
        self._after(lease_ms)

    # -- transitions ---------------------------------------------------------------------

    @rule(which=st.sampled_from(["current", "stale", "future"]), too_large=st.booleans())
    def complete(self, which: str, too_large: bool) -> None:
        m = self.model
        state = ResultState.TOO_LARGE if too_large else ResultState.STORED
        payload = None if too_large else f"r{m.token}".encode()
        ok = self.store.complete(
            KEY, self._token(which), result=payload, result_state=state, retention_ms=LONG
        )
        expect = False
        if m.status is not None and which == "current":
            if m.status is Status.COMPLETED:
                expect = True
            elif m.status in (Status.PENDING, Status.DISPATCHED, Status.UNKNOWN):
                expect = True
                m.status, m.lease, m.owner = Status.COMPLETED, "none", ""
                m.result, m.result_state = payload, state
        assert ok is expect, (which, m)

    @rule(which=st.sampled_from(["current", "stale"]), ran=st.booleans())
    def release(self, which: str, ran: bool) -> None:
        m = self.model
        ok = self.store.release(KEY, self._token(which), error="ValueError", retention_ms=LONG, ran=ran)
        expect = False
        if m.status is not None and which == "current":
            if m.status in (Status.PENDING, Status.DISPATCHED):
                if m.status is Status.DISPATCHED and not ran:
                    m.attempt = max(0, m.attempt - 1)
                m.status, m.lease, m.owner, expect = Status.RELEASED, "none", "", True
                m.released_by = "release"
            elif m.status is Status.UNKNOWN:
                m.lease, m.owner, expect = "none", "", True
        assert ok is expect, (which, m)

    @rule(which=st.sampled_from(["current", "stale"]), ran=st.booleans())
    def mark_unknown(self, which: str, ran: bool) -> None:
        m = self.model
        ok = self.store.mark_unknown(KEY, self._token(which), error="TimeoutError", ran=ran)
        expect = False
        if m.status is not None and which == "current":
            if m.status is Status.UNKNOWN:
                expect = True
            elif m.status is Status.DISPATCHED:
                m.attempt = m.attempt if ran else max(0, m.attempt - 1)
                m.status, m.lease, expect = Status.UNKNOWN, "none", True
        assert ok is expect, (which, m)

    @rule(which=st.sampled_from(["current", "stale"]))
    def fail(self, which: str) -> None:
        m = self.model
        ok = self.store.fail(KEY, self._token(which), error="Declined", failure="{}", retention_ms=LONG)
        expect = False
        if m.status is not None and which == "current":
            if m.status is Status.FAILED:  # failed already under this token: a retried fail
                expect = True
            elif m.status is Status.DISPATCHED:
                m.status, m.lease, m.owner, expect = Status.FAILED, "none", "", True
        assert ok is expect, (which, m)

    @rule(
        which=st.sampled_from(["current", "stale"]),
        lease_ms=st.sampled_from([LONG, SHORT]),
        cap=st.sampled_from([0, 1, 2]),
    )
    def dispatch(self, which: str, lease_ms: int, cap: int) -> None:
        m = self.model
        attempt = self.store.dispatch(
            KEY, self._token(which), lease_ms=lease_ms, max_attempts=cap, retention_ms=LONG
        )
        expect = 0
        if m.status is not None and which == "current":
            if m.status is Status.DISPATCHED:  # a retried dispatch: the same attempt, a lease from now
                expect, m.lease = m.attempt, lease_after(lease_ms)
            elif (m.status is Status.PENDING or (m.status is Status.UNKNOWN and m.lease != "none")) and (
                0 < cap <= m.attempt
            ):  # parked: the execution would be past the cap
                m.token += 1
                m.status, m.lease, m.owner, expect = Status.FAILED, "none", "", -1
            elif m.status is Status.PENDING or (m.status is Status.UNKNOWN and m.lease != "none"):
                if m.status is Status.UNKNOWN:  # the reconciler executes: it owns the record
                    m.input_hash = m.reconciler_hash
                m.attempt += 1
                m.status, m.lease, expect = Status.DISPATCHED, lease_after(lease_ms), m.attempt
        assert attempt == expect, (which, m)
        self._after(lease_ms)

    @rule(which=st.sampled_from(["current", "stale"]), lease_ms=st.sampled_from([LONG, SHORT]))
    def renew(self, which: str, lease_ms: int) -> None:
        m = self.model
        ok = self.store.renew(KEY, self._token(which), lease_ms=lease_ms)
        expect = (
            m.status in (Status.PENDING, Status.DISPATCHED, Status.UNKNOWN)
            and which == "current"
            and m.lease != "none"
        )
        if expect:
            m.lease = lease_after(lease_ms)
        assert ok is expect, (which, m)
        self._after(lease_ms)

    @rule(applied=st.booleans())
    def resolve(self, applied: bool) -> None:
        m = self.model
        doubtful = m.status in (Status.UNKNOWN, Status.FAILED) or (
            m.status is Status.DISPATCHED and m.lease != "live"
        )
        if applied:  # as a resolve like this one left it (no effect's result is b"op")
            settled = m.status is Status.COMPLETED and m.result == b"op"
        else:
            settled = m.status is Status.RELEASED and m.released_by == "resolve"
        try:
            record = self.store.resolve(KEY, applied=applied, result=b"op", retention_ms=LONG)
        except ResolveRefusedError as refused:
            assert not doubtful and not settled, m
            assert refused.status == (m.status.value if m.status else None)
            return
        assert doubtful or settled, m
        if doubtful:
            m.token += 1
            m.lease, m.owner = "none", ""
            if applied:
                m.status, m.result, m.result_state = Status.COMPLETED, b"op", ResultState.STORED
            else:
                m.status, m.released_by = Status.RELEASED, "resolve"
                m.attempt = 0  # the operator's verdict starts the count again
        assert record.status is m.status

    @invariant()
    def record_matches(self) -> None:
        if not hasattr(self, "store"):
            return
        record = self.store.get(KEY)
        m = self.model
        if m.status is None:
            assert record is None
            return
        assert record is not None
        assert (record.status, record.token, record.attempt) == (m.status, m.token, m.attempt), (record, m)
        assert record.input_hash == m.input_hash, (record, m)
        if m.status is Status.COMPLETED:
            assert record.result == (m.result if m.result_state is ResultState.STORED else None)


SETTINGS = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class MemoryMachine(StoreMachine):
    def make_store(self, namespace: str) -> effectq.Store:
        return effectq.MemoryStore(namespace=namespace)


class FakeRedisMachine(StoreMachine):
    def make_store(self, namespace: str) -> effectq.Store:
        return effectq.RedisStore.embedded(namespace=namespace)


class RealRedisMachine(StoreMachine):
    client = redis.Redis.from_url(REDIS_URL)

    def make_store(self, namespace: str) -> effectq.Store:
        return effectq.RedisStore(self.client, namespace=namespace)

    def cleanup(self, namespace: str) -> None:
        delete_namespace(self.client, namespace)


TestMemoryModel = pytest.mark.filterwarnings("ignore")(MemoryMachine.TestCase)
TestMemoryModel.settings = SETTINGS
TestFakeRedisModel = FakeRedisMachine.TestCase
TestFakeRedisModel.settings = SETTINGS
TestRealRedisModel = RealRedisMachine.TestCase
TestRealRedisModel.settings = SETTINGS
