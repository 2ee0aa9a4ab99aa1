"""``effectq list``, ``show`` and ``resolve`` of failed records: a key parked after its attempts
ran out, and a recorded terminal exception; against a real Redis."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

import effectq
from effectq.cli import Exit, main


class Bounced(Exception):
    pass


@pytest.fixture
def cli(redis_url: str, namespace: str, capsys: pytest.CaptureFixture[str]) -> Any:
    def run(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--url", redis_url, "--namespace", namespace])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        return code, captured.out, captured.err

    return run


def test_a_parked_key_is_listed_shown_and_reset(cli: Any, redis_store: effectq.RedisStore) -> None:
    """``list --status failed`` shows the parked key and its last error, ``show`` says how to reset
    it, and ``resolve --not-applied`` lets the next call run."""
    outcome: list[Exception | None] = [Bounced("mailbox full")]

    @effectq.effect(name="cli.mail", max_attempts=1)
    def send(to: str) -> str:
        if outcome[0] is not None:
            raise outcome[0]
        return "sent"

    run = f"run-{uuid.uuid4().hex[:8]}"
    with effectq.run(run, store=redis_store):
        key = send.key("ada")
    with effectq.run(run, store=redis_store), pytest.raises(Bounced):
        send("ada")
    with effectq.run(run, store=redis_store), pytest.raises(effectq.AttemptsExhausted):
        send("ada")
    code, out, err = cli("list", "--status", "failed")
    assert code == Exit.OK and key in out and "mailbox full" in out
    assert "effectq resolve KEY --not-applied" in err
    listed = json.loads(cli("list", "--status", "failed", "--json")[1])
    assert [(item["key"], item["standing"], item["attempt"]) for item in listed] == [(key, "failed", 1)]
    code, out, _ = cli("show", key)
    assert code == Exit.OK and "parked after 1 attempts" in out and "--not-applied" in out
    code, out, _ = cli("resolve", key, "--not-applied", "--note", "ops: mailbox emptied")
    assert code == Exit.OK and "was failed" in out
    outcome[0] = None
    with effectq.run(run, store=redis_store):
        assert send("ada") == "sent"


def test_a_recorded_terminal_exception_is_shown(cli: Any, redis_store: effectq.RedisStore) -> None:
    @effectq.effect(name="cli.charge", terminal=[Bounced])
    def charge(n: int) -> None:
        raise Bounced("card declined")

    run = f"run-{uuid.uuid4().hex[:8]}"
    with effectq.run(run, store=redis_store):
        key = charge.key(1)
    with effectq.run(run, store=redis_store), pytest.raises(Bounced):
        charge(1)
    code, out, _ = cli("show", key)
    assert code == Exit.OK and "a terminal exception" in out and f"{__name__}.Bounced" in out
