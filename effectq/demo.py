"""A worker dies after a side effect; the task is redelivered; nothing happens twice.

    python -m effectq.demo                      # embedded Redis (fakeredis + the real Lua)
    python -m effectq.demo --redis-url redis://127.0.0.1:6379/0

A "welcome" task sends an email, charges a card and posts to a chat. A real
worker process runs it and is killed with SIGKILL right after the card was
charged, before effectq could record it; the broker redelivers the task to a
second worker process. The demo runs the story twice, without effectq and with
it, and prints what the customer got each time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import effectq

LEASE = 1.0


def _client(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, decode_responses=True)


# -- the remote systems: a shared ledger of what the customer received -------------------


class Remote:
    """Email, payment and chat providers, recorded in one Redis list (outside effectq's keys)."""

    def __init__(self, url: str, ledger: str) -> None:
        self.client = _client(url)
        self.ledger = ledger

    def deliver(self, system: str, what: str, idempotency_key: str = "") -> str:
        entry = {"system": system, "what": what, "key": idempotency_key, "pid": os.getpid()}
        self.client.rpush(self.ledger, json.dumps(entry))
        return f"{system}-{self.client.llen(self.ledger)}"

    def find(self, system: str, idempotency_key: str) -> str | None:
        """What a provider's API answers to "did you get a request with this key?"."""
        for i, raw in enumerate(self.client.lrange(self.ledger, 0, -1), 1):
            entry = json.loads(raw)
            if entry["system"] == system and entry["key"] == idempotency_key:
                return f"{system}-{i}"
        return None

    def received(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self.client.lrange(self.ledger, 0, -1)]


# -- the task, as a worker runs it --------------------------------------------------------


def welcome_task(remote: Remote, customer: str, *, crash_after_charge: bool, guarded: bool) -> None:
    """The body of the task. With ``guarded``, each side effect is an effectq effect."""

    def send_email(to: str) -> str:
        return remote.deliver("email", f"welcome mail to {to}")

    def charge(amount: int) -> str:
        key = effectq.current_effect().idempotency_key if guarded else ""
        receipt = remote.deliver("payment", f"charge {customer} {amount} EUR", key)
        if crash_after_charge:
            print(
                "    worker: card charged ... and the worker is killed (SIGKILL) before the ack", flush=True
            )
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt

    def post_chat(text: str) -> str:
        return remote.deliver("chat", text)

    def find_charge(key: str, args: dict[str, Any], ctx: effectq.EffectContext) -> str | None:
        found = remote.find("payment", ctx.idempotency_key)
        print(f"    worker: charge outcome unknown; asked the payment provider: {found or 'not found'}")
        return found

    email: Callable[[str], str] = send_email
    pay: Callable[[int], str] = charge
    chat: Callable[[str], str] = post_chat
    if guarded:
        email = effectq.effect(name="welcome.email")(send_email)
        pay = effectq.effect(name="welcome.charge", lease=LEASE, reconcile=find_charge)(charge)
        chat = effectq.effect(name="welcome.chat")(post_chat)
    pid = os.getpid()
    print(f"    worker {pid}: email -> {email(customer)}", flush=True)
    print(f"    worker {pid}: charge -> {pay(49)}", flush=True)
    print(f"    worker {pid}: chat -> {chat(f'{customer} joined')}", flush=True)


def worker_main(url: str, namespace: str, ledger: str, run_id: str, crash: bool, guarded: bool) -> None:
    remote = Remote(url, ledger)
    if not guarded:
        welcome_task(remote, "ada@example.com", crash_after_charge=crash, guarded=False)
        return
    store = effectq.RedisStore.from_url(url, namespace=namespace)
    with effectq.run(run_id, store=store) as bound:
        welcome_task(remote, "ada@example.com", crash_after_charge=crash, guarded=True)
    stats = bound.stats
    print(
        f"    worker {os.getpid()}: done ({stats.executed} applied, {stats.replayed} replayed, "
        f"{stats.reconciled} reconciled)",
        flush=True,
    )


# -- the story -------------------------------------------------------------------------


def deliver(url: str, namespace: str, ledger: str, run_id: str, *, crash: bool, guarded: bool) -> int:
    """Run one delivery of the task in a fresh worker process; returns its exit status."""
    args = [sys.executable, "-m", "effectq.demo", "--worker", url, namespace, ledger, run_id]
    args += ["--crash"] if crash else []
    args += ["--guarded"] if guarded else []
    return subprocess.run(args, check=False).returncode


def story(url: str, *, guarded: bool) -> list[dict[str, Any]]:
    namespace = f"demo-{uuid.uuid4().hex[:8]}"
    ledger = f"effectq-demo:{namespace}:ledger"
    run_id = f"welcome:{uuid.uuid4()}"  # the task id, the same in both deliveries
    title = "WITH effectq" if guarded else "WITHOUT effectq"
    print(f"\n== {title} ==")
    print(f"  delivery 1 of task {run_id}")
    status = deliver(url, namespace, ledger, run_id, crash=True, guarded=guarded)
    print(f"  the worker died (exit {status}); the broker redelivers the task")
    if guarded:
        print(f"  (the dead worker's claim on the charge runs out after its {LEASE:.0f}s lease)")
        time.sleep(LEASE)
    print(f"  delivery 2 of task {run_id}")
    deliver(url, namespace, ledger, run_id, crash=False, guarded=guarded)
    remote = Remote(url, ledger)
    received = remote.received()
    leftovers = [ledger, *remote.client.scan_iter(match=f"effectq:{{{namespace}*")]
    remote.client.delete(*leftovers)  # the demo leaves nothing behind in your Redis
    return received


def summary(received: list[dict[str, Any]]) -> str:
    counts = {
        system: sum(1 for e in received if e["system"] == system) for system in ("email", "payment", "chat")
    }
    return ", ".join(f"{n} {system}" for system, n in counts.items())


def embedded_server() -> str:
    """A fakeredis server on a free loopback port, running the real Lua scripts."""
    try:
        from fakeredis import TcpFakeServer
    except ImportError:
        sys.exit("the embedded demo needs fakeredis: pip install 'effectq[embedded]', or pass --redis-url")
    server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = int(server.server_address[1])
    return f"redis://127.0.0.1:{port}/0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m effectq.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", help="a real Redis (default: an embedded fakeredis server)")
    parser.add_argument("--worker", nargs=4, metavar=("URL", "NS", "LEDGER", "RUN"), help=argparse.SUPPRESS)
    parser.add_argument("--crash", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--guarded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        url, namespace, ledger, run_id = args.worker
        worker_main(url, namespace, ledger, run_id, crash=args.crash, guarded=args.guarded)
        return 0
    url = args.redis_url or embedded_server()
    where = "Redis at " + url if args.redis_url else "an embedded Redis (fakeredis running the real Lua)"
    print(f"effectq demo on {where}")
    print("A welcome task sends an email, charges a card and posts to chat; its worker is killed")
    print("right after the charge, and the broker redelivers the task to a new worker.")
    naive = story(url, guarded=False)
    guarded = story(url, guarded=True)
    print("\n== what the customer got ==")
    print(f"  without effectq: {summary(naive)}")
    print(f"  with effectq:    {summary(guarded)}")
    once = all(sum(1 for e in guarded if e["system"] == s) == 1 for s in ("email", "payment", "chat"))
    print("  every side effect applied exactly once." if once else "  SOMETHING APPLIED TWICE.")
    return 0 if once else 1


if __name__ == "__main__":
    sys.exit(main())
