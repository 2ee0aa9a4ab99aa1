"""Objects every call builds are built positionally (a class called with keywords first builds
a dict of them); each field must still land where its name says."""

from __future__ import annotations

import time

import effectq
from effectq.store.base import Claim, ClaimKind, ClaimRequest, ResultState, Status
from effectq.store.redis.replies import completed_claim, decode_claim


def _hook(key: str, args: object, ctx: object) -> None:
    return None


def test_a_call_asks_the_store_what_its_options_say() -> None:
    store = effectq.MemoryStore()
    plain = effectq.effect(name="pos.plain", lease=3, retention=5)(lambda n: n)
    keyed = effectq.effect(
        name="pos.keyed",
        key=lambda args, ctx: f"k{args['n']}",
        reconcile=_hook,
        reconcile_on="always",
        replay_safe=True,
        lease=7,
        retention=11,
    )(lambda n: n)
    with effectq.run("pos-run", store=store) as bound:
        first = plain._prepare((1,), {})
        assert first.request == ClaimRequest(
            lease_ms=3000,
            owner=first.request.owner,
            name="pos.plain",
            run_id="pos-run",
            input_hash="",
            can_reconcile=False,
            replay_safe=False,
            reconcile_first=False,
            retention_ms=5000,
            prefetch=True,
            max_attempts=3,
        )
        bound.prefetch_tried = True
        second = keyed._prepare((2,), {})
        assert second.request == ClaimRequest(
            lease_ms=7000,
            owner=second.request.owner,
            name="pos.keyed",
            run_id="pos-run",
            input_hash=second.input_hash,
            can_reconcile=True,
            replay_safe=True,
            reconcile_first=True,
            retention_ms=11000,
            prefetch=False,
            max_attempts=3,
        )
        flags = {
            name: (c.request.can_reconcile, c.request.replay_safe, c.request.reconcile_first)
            for name, c in (
                ("reconcile", effectq.effect(name="pos.r", reconcile=_hook)(lambda n: n)._prepare((3,), {})),
                ("safe", effectq.effect(name="pos.s", replay_safe=True)(lambda n: n)._prepare((3,), {})),
            )
        }
        assert flags == {"reconcile": (True, False, False), "safe": (False, True, False)}
        assert len(second.input_hash) == 32 and first.request.owner != second.request.owner
        ctx = second.context(9, 4, None)
        fields = (ctx.key, ctx.run_id, ctx.name, ctx.attempt, ctx.namespace, ctx.token, ctx.ordinal, ctx.args)
        assert fields == (
            "k2",
            "pos-run",
            "pos.keyed",
            4,
            store.namespace,
            9,
            0,
            {"n": 2},
        )
        assert ctx._lease is None


def test_claim_replies_read_into_the_fields_they_name() -> None:
    packed = b"c1\n12\n3\n\n1700000000000\npos.name\nrun\n:0123456789abcdef\nabcd\n\nresult-bytes"
    assert completed_claim("k", packed, b"hint") == Claim(
        kind=ClaimKind.COMPLETED,
        token=12,
        attempt=3,
        status=Status.COMPLETED,
        result=b"result-bytes",
        result_state=ResultState.STORED,
        input_hash="abcd",
        prefetch_hint=b"hint",
    )
    assert decode_claim("k", [1, 5, 2, b"d", b"why"]) == Claim(
        kind=ClaimKind.CLAIMED, token=5, attempt=2, status=Status.DISPATCHED, error="why"
    )
    assert decode_claim("k", [5, 6, 0, b"p", b""]) == Claim(
        kind=ClaimKind.RECONCILE, token=6, attempt=0, status=Status.PENDING
    )


def test_events_carry_each_field_where_its_name_says() -> None:
    from effectq import events

    store = effectq.MemoryStore()
    seen: list[events.Event] = []
    double = effectq.effect(name="pos.events")(lambda n: n * 2)
    unsubscribe = events.subscribe(seen.append)
    try:
        with effectq.run("pos-events", store=store):
            started = time.time_ns()
            double(4)
            key = double.key(4)
    finally:
        unsubscribe()
    assert [(e.kind, e.step, e.attempt) for e in seen] == [
        (events.EventKind.CLAIMED, "claim", 1),
        (events.EventKind.EXECUTED, "execute", 1),
        (events.EventKind.COMPLETED, "complete", 1),
    ]
    for event in seen:
        assert (event.name, event.key, event.run_id, event.namespace, event.error) == (
            "pos.events",
            key,
            "pos-events",
            store.namespace,
            "",
        )
        assert isinstance(event.started_ns, int) and event.started_ns >= started
        assert isinstance(event.duration, float) and 0 <= event.duration < 60
