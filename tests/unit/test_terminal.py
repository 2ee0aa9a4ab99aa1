"""A terminal exception is recorded and raised again, the function not run, until an operator or
the retention clears it; on every store (memory, fakeredis, Redis) alike."""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

import pytest

import effectq
from effectq.errors import ConfigurationError, RecordedFailure
from effectq.store.base import Status


class CardDeclined(Exception):
    """A payment gateway's refusal: the charge did not happen and will not on a retry."""


class Refused(Exception):
    """Its constructor does not take its ``args`` back (they are the message alone)."""

    def __init__(self, code: int) -> None:
        self.code = code
        super().__init__(f"refused with code {code}")


class RefusedWithArgs(Refused):
    """The same, with ``effectq_args``: what rebuilds it."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.effectq_args = [code]


def _run() -> str:
    return f"run-{uuid.uuid4().hex[:8]}"


def _charging(store: effectq.Store, raised: BaseException, **options: Any) -> tuple[Any, list[int]]:
    calls: list[int] = []

    @effectq.effect(name="pay.charge", terminal=(CardDeclined, f"{__name__}.Refused"), **options)
    def charge(amount: int) -> str:
        calls.append(amount)
        raise raised

    return charge, calls


def test_a_terminal_exception_is_raised_again_without_running(store: effectq.Store) -> None:
    """The second call raises the same type with the same message; the function ran once."""
    charge, calls = _charging(store, CardDeclined("card declined: insufficient funds"))
    run = _run()
    with effectq.run(run, store=store), pytest.raises(CardDeclined, match="insufficient funds"):
        charge(100)
    with effectq.run(run, store=store), pytest.raises(CardDeclined) as again:  # a redelivery
        charge(100)
    assert str(again.value) == "card declined: insufficient funds"
    assert calls == [100]
    assert isinstance(again.value.__cause__, RecordedFailure)
    record = store.get(_key(store, run, charge))
    assert record is not None and record.status is Status.FAILED
    assert json.loads(record.failure) == {
        "type": f"{__name__}.CardDeclined",
        "message": "card declined: insufficient funds",
        "args": ["card declined: insufficient funds"],
    }
    assert record.expires_at is not None  # kept for the retention, not for ever


def _key(store: effectq.Store, run: str, effect: Any, *args: Any) -> str:
    with effectq.run(run, store=store):
        return str(effect.key(*(args or (100,))))


def test_a_qualified_name_declares_a_terminal_exception(store: effectq.Store) -> None:
    """``terminal`` takes names as ``maybe_applied`` does; ``effectq_args`` rebuilds a type whose
    constructor does not take its ``args`` back."""
    charge, calls = _charging(store, RefusedWithArgs(51))
    run = _run()
    for _ in range(2):
        with effectq.run(run, store=store), pytest.raises(RefusedWithArgs) as raised:
            charge(5)
    assert (raised.value.code, str(raised.value), calls) == (51, "refused with code 51", [5])


def test_an_exception_that_cannot_be_rebuilt_is_raised_as_a_recorded_failure(store: effectq.Store) -> None:
    """``Refused(*args)`` does not give the same exception back (its args are the message):
    RecordedFailure with the type and the message; never a second run."""
    charge, calls = _charging(store, Refused(7))
    run = _run()
    with effectq.run(run, store=store), pytest.raises(Refused):
        charge(5)
    with effectq.run(run, store=store), pytest.raises(RecordedFailure) as again:
        charge(5)
    assert (again.value.type_name, again.value.message) == (f"{__name__}.Refused", "refused with code 7")
    assert again.value.detail.endswith("Refused(*args) gives another message")
    assert "--not-applied" in str(again.value)
    assert calls == [5]


def test_a_type_that_no_longer_imports_is_raised_as_a_recorded_failure(store: effectq.Store) -> None:
    class Local(Exception):
        pass

    @effectq.effect(name="pay.local", terminal=[Local])
    def local() -> None:
        raise Local("gone")

    run = _run()
    with effectq.run(run, store=store), pytest.raises(Local):
        local()
    with effectq.run(run, store=store), pytest.raises(RecordedFailure, match="does not import"):
        local()


def test_resolving_not_applied_clears_a_terminal_failure(store: effectq.Store) -> None:
    """An operator's ``resolve --not-applied`` lets the next call run again."""
    outcome: list[BaseException | None] = [CardDeclined("declined")]
    calls: list[int] = []

    @effectq.effect(name="pay.retry", terminal=[CardDeclined])
    def charge(amount: int) -> str:
        calls.append(amount)
        if outcome[0] is not None:
            raise outcome[0]
        return "charged"

    run = _run()
    with effectq.run(run, store=store), pytest.raises(CardDeclined):
        charge(1)
    key = _key(store, run, charge, 1)
    record = store.resolve(key, applied=False, note="card replaced", retention_ms=60_000)
    assert (record.status, record.attempt, record.failure) == (Status.RELEASED, 0, "")
    outcome[0] = None
    with effectq.run(run, store=store):
        assert charge(1) == "charged"
    assert calls == [1, 1]


def test_the_retention_ends_a_terminal_failure() -> None:
    """Kept for the effect's retention, as a released record is: then the key is free."""
    now = [1_000_000]
    store = effectq.MemoryStore(clock=lambda: now[0])
    charge, calls = _charging(store, CardDeclined("no"), retention=60)
    run = _run()
    with effectq.run(run, store=store), pytest.raises(CardDeclined):
        charge(1)
    now[0] += 61_000
    with effectq.run(run, store=store), pytest.raises(CardDeclined):
        charge(1)
    assert calls == [1, 1]


def test_a_base_exception_or_a_signal_is_never_terminal(store: effectq.Store) -> None:
    """A KeyboardInterrupt, or a declared type a signal handler raised, says nothing of how far the
    function got: recorded as maybe applied, as ever."""

    def handler(signum: int, frame: Any) -> None:
        raise CardDeclined("raised by a signal handler")

    @effectq.effect(name="pay.signalled", terminal=[CardDeclined, KeyboardInterrupt])
    def signalled(how: str) -> None:
        if how == "interrupt":
            raise KeyboardInterrupt
        previous = signal.signal(signal.SIGUSR1, handler)
        try:
            signal.raise_signal(signal.SIGUSR1)
        finally:
            signal.signal(signal.SIGUSR1, previous)

    run = _run()
    for how, raised in (("interrupt", KeyboardInterrupt), ("signal", CardDeclined)):
        with effectq.run(run, store=store), pytest.raises(raised):
            signalled(how)
        with effectq.run(run, store=store), pytest.raises(effectq.OutcomeUnknown):
            signalled(how)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"terminal": [42]}, "terminal takes exception classes or qualified names"),
        ({"terminal": lambda exc: True}, "terminal takes exception classes or qualified names"),
        ({"max_attempts": 0}, "max_attempts must be a whole number from 1 to 10"),
        ({"max_attempts": 11}, "max_attempts must be a whole number from 1 to 10"),
        ({"max_attempts": True}, "max_attempts must be a whole number from 1 to 10"),
        ({"max_attempts": "3"}, "max_attempts must be a whole number from 1 to 10"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        effectq.effect(name="bad.options", **options)


def test_an_async_effect_replays_its_terminal_exception(store: effectq.Store) -> None:
    """The event loop's path (the async store on Redis) reads a failed claim as the thread's does."""
    import asyncio

    calls: list[int] = []

    @effectq.effect(name="pay.async", terminal=[CardDeclined])
    async def charge(amount: int) -> str:
        calls.append(amount)
        raise CardDeclined("declined, async")

    async def twice() -> None:
        run = _run()
        for _ in range(2):
            async with effectq.run(run, store=store):
                with pytest.raises(CardDeclined, match="declined, async"):
                    await charge(9)

    asyncio.run(twice())
    assert calls == [9]
