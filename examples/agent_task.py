"""A Celery task runs an agent; its worker is SIGKILLed after a refund; the task is redelivered.

    python examples/agent_task.py       # the proof: real Celery workers on the local Redis

The agent is a hand-written function-calling loop, as with the OpenAI or
Anthropic SDKs, over a scripted model that counts its calls: look the order up,
refund it, email the customer, answer. Its model call is an ``effectq.step``
and its side-effecting tools are wrapped by ``effectq.wrap_tools``.

The proof starts a real worker (``--pool=solo``, ``acks_late``), which kills
itself with SIGKILL right after the refund applied, before the task was acked.
A second worker gets the task redelivered (after the Redis broker's visibility
timeout) under the same task id, which is the run id: the two model steps that
had returned replay from the journal (not paid for again, so the agent makes
the same plan), the refund returns its recorded result, and the agent goes on
from the first step that never returned. At the end the model was called once
per step in total and each tool applied once; the read-only lookup ran again.

Settings come from the environment: ``AGENT_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``) and ``AGENT_NAMESPACE`` (default
``agent-example``): every key the example writes (broker, results, effect
records, the counters) starts with the namespace, and only those are deleted.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from celery import Celery, Task

import effectq
import effectq.celery

REDIS_URL = os.environ.get("AGENT_REDIS_URL", "redis://127.0.0.1:6379/0")
NAMESPACE = os.environ.get("AGENT_NAMESPACE", "agent-example")
CRASH_AFTER = os.environ.get("AGENT_CRASH_AFTER", "")
"""The tool after whose first application the worker SIGKILLs itself (the proof sets it)."""
VISIBILITY_TIMEOUT = 5
"""Seconds before the Redis broker hands an unacked task to another worker."""

app = Celery("agent_task", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_acks_late=True,  # ack after the task: a killed worker's task is redelivered
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=f"{NAMESPACE}.agent",
    broker_connection_retry_on_startup=True,
    broker_transport_options={
        "global_keyprefix": f"{NAMESPACE}:",
        "visibility_timeout": VISIBILITY_TIMEOUT,
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    },
    result_backend_transport_options={"global_keyprefix": f"{NAMESPACE}:"},
)
effectq.celery.install(app, REDIS_URL, namespace=NAMESPACE)  # a run per task: the task id is the run id


@functools.cache
def counters() -> Counters:
    return Counters(REDIS_URL, f"{NAMESPACE}:counts")


class Counters:
    """What the outside world saw: model calls per step, tool applications, deliveries."""

    def __init__(self, url: str, key: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.key = key

    def add(self, what: str) -> None:
        self.client.hincrby(self.key, what, 1)

    def read(self) -> dict[str, int]:
        return {k: int(v) for k, v in sorted(self.client.hgetall(self.key).items())}

    def first(self, what: str) -> bool:
        """True the first time ``what`` is asked, across processes."""
        return bool(self.client.hsetnx(self.key, what, 1))


# -- the model: scripted, counting its calls ---------------------------------------------------

PLAN = [
    ("lookup_order", {"order_id": 42}),
    ("refund", {"order_id": 42, "amount": 30.0}),
    ("send_email", {"to": "ada@example.com", "subject": "Your refund of 30.0 for order 42"}),
]
ANSWER = "Refunded 30.0 for order 42 and told the customer."


@effectq.step(name="llm")
def call_model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat-completion call (scripted). Each real call is paid for: it is counted."""
    step = sum(1 for m in messages if m["role"] == "assistant")
    counters().add(f"model step {step}")
    if step == len(PLAN):
        return {"role": "assistant", "content": ANSWER}
    name, arguments = PLAN[step]
    call_id = f"call_{uuid.uuid4().hex[:12]}"  # a real model makes up a new id every time
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "function": function}]}


# -- the tools ------------------------------------------------------------------------------------


def lookup_order(order_id: int) -> dict[str, Any]:
    counters().add("read lookup_order")
    return {"order_id": order_id, "total": 30.0, "email": "ada@example.com"}


def refund(order_id: int, amount: float) -> dict[str, Any]:
    counters().add("applied refund")
    return {"refund_id": f"re_{order_id}", "amount": amount}


def send_email(to: str, subject: str) -> dict[str, Any]:
    counters().add("applied send_email")
    return {"message_id": f"msg_{uuid.uuid4().hex[:8]}", "to": to}


TOOLS = effectq.wrap_tools(
    {"lookup_order": lookup_order, "refund": refund, "send_email": send_email},
    effects=["refund", "send_email"],
)


def run_agent(ticket: str) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": ticket}]
    for _ in range(10):
        reply = call_model(messages)
        messages.append(reply)
        if not reply.get("tool_calls"):
            return str(reply["content"])
        for call in reply["tool_calls"]:
            name = call["function"]["name"]
            result = TOOLS[name](**json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
            if name == CRASH_AFTER and counters().first("crashed"):
                os.kill(os.getpid(), signal.SIGKILL)  # the worker dies before the task is acked
    raise RuntimeError("the agent did not finish in 10 steps")


@app.task(bind=True, name="agent_task.handle_ticket")
def handle_ticket(self: Task, ticket: str) -> str:
    counters().add("deliveries")
    return run_agent(ticket)  # a redelivery is the same run: what already happened replays


# -- the proof ----------------------------------------------------------------------------------


def _worker(crash_after: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AGENT_REDIS_URL": REDIS_URL, "AGENT_NAMESPACE": NAMESPACE}
    env["AGENT_CRASH_AFTER"] = crash_after
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "celery", "--quiet", "-A", "agent_task", "worker", "--pool=solo"]
    command += ["--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel=WARNING"]
    return subprocess.Popen(command, env=env)


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def clean() -> None:
    """Delete every key of the namespace (SCAN, never FLUSH)."""
    client = redis.Redis.from_url(REDIS_URL)
    for pattern in (f"{NAMESPACE}:*", f"effectq:{{{NAMESPACE}:*", f"effectq:{{{NAMESPACE}}}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    client.close()


def prove(timeout: float = 180.0) -> dict[str, Any]:
    """Run the story with real workers; return what happened."""
    clean()
    result = handle_ticket.delay("Order 42 arrived broken. Refund it and tell me.")
    first = _worker(crash_after="refund")
    try:
        first_exit = first.wait(timeout=timeout)
    finally:
        _stop(first)
    second = _worker(crash_after="refund")
    try:
        answer = result.get(timeout=timeout)
    finally:
        _stop(second)
    return {"first_worker_exit": first_exit, "answer": answer, "task_id": result.id, **counters().read()}


def main() -> int:
    started = time.monotonic()
    seen = prove()
    print(f"task {seen['task_id']}: {seen['answer']}")
    print(f"first worker exit code {seen['first_worker_exit']} (SIGKILL is -{int(signal.SIGKILL)})")
    for what, count in seen.items():
        if what.startswith(("model", "applied", "read", "deliveries")):
            print(f"  {what:<22} {count}")
    steps = [seen.get(f"model step {n}", 0) for n in range(len(PLAN) + 1)]
    once = (
        seen["first_worker_exit"] == -signal.SIGKILL
        and seen.get("deliveries") == 2
        and steps == [1] * len(steps)
        and seen.get("applied refund") == seen.get("applied send_email") == 1
    )
    print(
        f"{'OK' if once else 'FAILED'}: killed and redelivered; every model step paid once, every tool "
        f"applied once ({time.monotonic() - started:.1f}s)"
    )
    clean()
    return 0 if once else 1


if __name__ == "__main__":
    sys.exit(main())
