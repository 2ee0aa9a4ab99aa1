"""A worker's time limit, landing at random moments of effect calls, leaves every record true.

Celery's soft time limit raises billiard's ``SoftTimeLimitExceeded`` from a
SIGALRM handler wherever the task's thread is: in the claim's round trip,
between the claim and the function, in the function, between the function's
return and its completion, in the run's end that reads a posted completion's
reply. The fuzz fires it once per call, at a random delay drawn over a call's
length, over many calls on the real Redis (and an asyncio phase that cancels
calls at random moments). An interrupted task is delivered again once its
background writes landed, as a retried task would be, to another store (as to
another worker).

Then the ledger (the side effects, one append each in this process) is held
against every record, read with the store's own API:

* no key applied twice, and a completed record holds its call's result;
* an applied key is completed, or unknown because the limit cut its function
  (the record says so): never left dispatched, never released, never missing;
* a key whose function never ran is released or absent (or, cut on its way
  into the function, unknown: maybe applied, never wrong): never left dispatched.

The limit does not land inside two libraries' code that an exception breaks for
other threads (see ``_unsafe_to_land``). A failure prints the seed; the child
runs by hand:

    python -m tests.processes.test_time_limit_fuzz URL NAMESPACE SEED CALLS
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

import effectq


@pytest.fixture(scope="module")
def redis_url(private_redis_url: str) -> str:
    """These tests pause clients: they run on a server of their own."""
    return private_redis_url


ROOT = Path(__file__).resolve().parents[2]
CALLS = 1000
"""Calls per fuzz (each interrupted one is delivered again)."""
ASYNC_CALLS = 200
"""Calls of the asyncio phase (cancelled at random moments)."""
FIXED_SEED = 1500
HIDE_HIREDIS = (
    "import runpy, sys; sys.modules['hiredis'] = None; "
    "runpy.run_module('tests.processes.test_time_limit_fuzz', run_name='__main__', alter_sys=True)"
)
"""How the child runs without hiredis (redis-py and effectq then frame and parse in Python), with
``EFFECTQ_FUZZ_HIREDIS=0``. By default it runs as installed: with hiredis, whose
``pack_command`` a signal must not crash (see tests/processes/test_signal_storm.py)."""
WATCHDOG = 90.0
"""A child still running this long after it started dumps its threads and exits: a hang."""
PARKED = (effectq.OutcomeUnknown, effectq.InProgress, effectq.AttemptsExhausted)
"""What a delivery may end in besides the limit, looked up once: ``effectq.X`` is found lazily the
first time (an import's Python), and a limit landing in the harness's own except clause there
escaped it."""

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")


def _seeds() -> list[int]:
    return [FIXED_SEED, random.SystemRandom().randrange(1, 2**31)]


@pytest.mark.parametrize("seed", _seeds())
def test_a_time_limit_at_random_moments_leaves_no_record_wrong(
    seed: int, redis_url: str, redis_client: redis.Redis, namespace: str
) -> None:
    """A time limit raised at random moments of 1,000 calls (and cancellations of 200 async
    ones): no key applies twice, no applied key is left dispatched or re-runnable, no key
    claimed and never run is left dispatched, and every unknown record was caused by the limit
    cutting its function."""
    child = ["-m", "tests.processes.test_time_limit_fuzz"]
    if os.environ.get("EFFECTQ_FUZZ_HIREDIS") == "0":
        child = ["-c", HIDE_HIREDIS]
    proc = subprocess.Popen(
        [sys.executable, *child, redis_url, namespace, str(seed), str(CALLS)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=WATCHDOG + 30.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"seed {seed}: the fuzz hung past its own watchdog\n{err[-6000:]}")
    assert proc.returncode == 0, f"seed {seed}: exit {proc.returncode}\n{err[-6000:]}"
    report = json.loads(out.strip().splitlines()[-1])
    assert report["problems"] == [], f"seed {seed}: {json.dumps(report, indent=1)[:6000]}"
    # The limit did land, and often: its moments are drawn from a span timed at the start, so a
    # machine busier during the run than at its start sees fewer land (53 of 1,000 seen there).
    assert report["interrupted"] >= CALLS // 50, report
    assert report["applied"] > CALLS // 4, report


def test_a_time_limit_between_a_claim_granted_after_a_wait_and_the_function_gives_the_claim_back(
    redis_store: effectq.RedisStore, onlooker: effectq.RedisStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call waits for its key, held by another worker; the holder's function raises (not
    applied) and releases it; the waiter is granted the claim, and the time limit lands as it
    stops watching, before its function runs. Nothing ran under that claim: it is given back,
    never left dispatched."""
    from billiard.exceptions import SoftTimeLimitExceeded

    from effectq._runtime.leases import heartbeat

    run_id = f"waited-{uuid.uuid4().hex[:8]}"
    waiter = threading.current_thread()
    ran: list[str] = []
    watching = threading.Event()

    @effectq.effect(name="fuzz.waited", wait=10.0)
    def act(n: int) -> int:
        ran.append(threading.current_thread().name)
        if threading.current_thread() is not waiter:
            assert watching.wait(10.0), "the waiter never watched the key"
            raise ValueError("not applied")
        return n

    def holder() -> None:
        with effectq.run(run_id, store=redis_store), pytest.raises(ValueError, match="not applied"):
            act(1)

    watch = onlooker.watch

    def watch_then_cut(key: str, callback: Any) -> Any:
        unsubscribe = watch(key, callback)
        watching.set()  # the holder gives the key up only once the waiter watches it

        def cut() -> None:  # the limit lands as the waiter stops watching
            unsubscribe()
            raise SoftTimeLimitExceeded()

        return cut

    monkeypatch.setattr(onlooker, "watch", watch_then_cut)
    with effectq.run(run_id, store=redis_store):
        key = act.key(1)
    thread = threading.Thread(target=holder, name="holder")
    thread.start()
    while not ran:
        time.sleep(0.01)
    with effectq.run(run_id, store=onlooker), pytest.raises(SoftTimeLimitExceeded):
        act(1)
    thread.join()
    deadline = time.monotonic() + 10.0
    while heartbeat.pending()[1] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ran == ["holder"]  # the waiter's function never ran
    record = onlooker.get(key)
    assert record is not None and record.status is effectq.Status.RELEASED, record


def test_a_time_limit_while_a_run_reads_its_pipelined_replies_is_raised_and_the_completion_lands(
    redis_url: str, redis_store: effectq.RedisStore
) -> None:
    """An effect's completion is pipelined; Redis holds it (CLIENT PAUSE), so the run's end waits
    for its reply, and the time limit lands in that wait. The limit is the task's: it leaves the
    run as it is, not swallowed; the completion whose reply went unread is written again in the
    background, and the record is completed."""
    from billiard.exceptions import SoftTimeLimitExceeded

    from effectq._runtime.leases import heartbeat

    admin = redis.Redis.from_url(redis_url)

    @effectq.effect(name="fuzz.pipelined")
    def act(n: int) -> int:
        admin.execute_command("CLIENT", "PAUSE", "800", "WRITE")  # its completion waits in Redis
        return n

    def on_alarm(signum: int, frame: Any) -> None:
        raise SoftTimeLimitExceeded()

    run_id = f"piped-{uuid.uuid4().hex[:8]}"
    with effectq.run(run_id, store=redis_store):
        key = act.key(1)

    def piped_run() -> None:
        with effectq.run(run_id, store=redis_store):
            assert act(1) == 1
            signal.setitimer(signal.ITIMER_REAL, 0.3)  # lands while the run's end reads the reply

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        with pytest.raises(SoftTimeLimitExceeded):
            piped_run()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        admin.execute_command("CLIENT", "UNPAUSE")
        admin.close()
    deadline = time.monotonic() + 20.0
    while heartbeat.pending()[1] and time.monotonic() < deadline:
        time.sleep(0.02)
    record = redis_store.get(key)
    assert record is not None and record.status is effectq.Status.COMPLETED, record


# -- the child ------------------------------------------------------------------------------


class _Limit:
    """Fires billiard's SoftTimeLimitExceeded once, ``delay`` seconds after :meth:`arm`."""

    def __init__(self) -> None:
        from billiard.exceptions import SoftTimeLimitExceeded

        self.exception = SoftTimeLimitExceeded
        self.live = False
        self.fired = False
        self.where = ""
        signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.live and _unsafe_to_land(frame):  # a little later instead
            signal.setitimer(signal.ITIMER_REAL, 20e-6)
            return
        if self.live:
            self.live = False
            self.fired = True
            self.where = _where(frame)
            raise self.exception()

    def arm(self, delay: float) -> None:
        self.fired = False
        self.where = ""
        self.live = True
        signal.setitimer(signal.ITIMER_REAL, max(delay, 1e-6))

    def disarm(self) -> None:
        self.live = False
        signal.setitimer(signal.ITIMER_REAL, 0)


_CONNECTING = frozenset({"connect", "connect_check_health", "on_connect", "on_connect_check_health"})


def _unsafe_to_land(frame: Any) -> bool:
    """Whether ``frame`` runs code of a library that an exception landing there breaks for
    other threads, which is not effectq's to fix; the limit lands a little later instead:

    * the standard library's logging takes its locks in Python code (``_acquireLock()``, then
      ``try``): one left held makes every other thread that logs, or connects through
      redis-py (which looks up a logger then), wait for ever;
    * redis-py's ``Connection.connect`` cleans up only after a ``RedisError``: cut in its
      handshake, the pool takes the connection back with the handshake's reply unread, and
      the next user (the heartbeat thread, say) reads that reply as its own, or waits out
      the socket timeout.
    """
    while frame is not None:
        code = frame.f_code
        if code.co_filename == logging.__file__:
            return True
        if code.co_name in _CONNECTING and code.co_filename.endswith("redis/connection.py"):
            return True
        frame = frame.f_back
    return False


def _where(frame: Any) -> str:
    """Where the limit landed: the innermost frames, effectq's and its libraries'."""
    parts = []
    while frame is not None and len(parts) < 6:
        code = frame.f_code
        if code.co_name in ("deliver", "_fuzz"):
            break
        parts.append(f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(parts)


def _fuzz(url: str, namespace: str, seed: int, calls: int) -> dict[str, Any]:
    import faulthandler

    faulthandler.enable()  # a crash prints where it happened
    faulthandler.dump_traceback_later(WATCHDOG, exit=True)

    import effectq
    from effectq._runtime.leases import heartbeat

    rng = random.Random(seed)
    client = redis.Redis.from_url(url)  # reads and cleans up, outside the storm
    # Each delivery of a task goes to a store of its own, as to another worker: an interrupted
    # call may leave its in-process single-flight entry behind (effect.py), which a later call
    # of the same key through the same store would wait on.
    stores = [effectq.RedisStore.from_url(url, namespace=namespace) for _ in range(4)]
    store = stores[0]
    started: set[str] = set()  # keys whose function began
    ledger: list[str] = []  # the side effects: one entry per application (an append is one step)
    landed: dict[str, list[str]] = {}  # where the limit landed, per key
    limit = _Limit()

    def body(n: int, fails: bool) -> int:
        key = effectq.current_effect().key
        started.add(key)
        if fails:
            raise ValueError("not applied")
        ledger.append(key)  # the side effect
        return n

    # A short wait: a delivery that meets its key still in flight (its first delivery's
    # record not settled) says so soon, and the record check below tells why.
    @effectq.effect(name="fuzz.apply", lease=60.0, wait=3.0)
    def apply(n: int, fails: bool) -> int:
        return body(n, fails)

    @effectq.effect(name="fuzz.apply_async", lease=60.0, wait=3.0)
    async def apply_async(n: int, fails: bool) -> int:
        started.add(effectq.current_effect().key)
        await asyncio.sleep(0)
        return body(n, fails)

    def deliver(n: int, fails: bool, delay: float | None, attempt: int = 0) -> str:
        """Delivery ``attempt`` of task ``n``: the effect inside its run, a time limit after ``delay``."""
        try:
            if delay is not None:
                limit.arm(delay)
            with effectq.run(f"fuzz-{n}", store=stores[attempt]):
                got = apply(n, fails)
            outcome = "returned" if got == n else f"returned {got!r} for {n}"
        except limit.exception:
            outcome = "interrupted"
        except ValueError:
            outcome = "raised"
        except PARKED as exc:
            outcome = type(exc).__name__  # parked: a failing task cut by the limit max_attempts times
        finally:
            limit.live = False  # first: no point between here and it for the alarm to land
            limit.disarm()
        if limit.fired:
            landed.setdefault(f"{n}", []).append(limit.where)
        return outcome

    # How long a call takes here, so the limit's moments spread over a whole call.
    spans = []
    for n in range(-40, 0):
        begun = time.perf_counter()
        deliver(n, False, None)
        spans.append(time.perf_counter() - begun)
    span = sorted(spans)[len(spans) // 2]

    tally: dict[str, int] = {}
    interrupted = 0
    for n in range(calls):
        fails = rng.random() < 0.1
        outcome = deliver(n, fails, rng.uniform(0.0, 1.3 * span))
        tally[outcome] = tally.get(outcome, 0) + 1
        for attempt in range(1, len(stores)):  # delivered again, as a retried task is
            if outcome != "interrupted":
                break
            interrupted += 1
            settled = time.monotonic() + 10.0  # a retried task comes back once its writes landed
            while heartbeat.pending()[1] and time.monotonic() < settled:
                time.sleep(0.001)
            delay = rng.uniform(0.0, 2.0 * span) if rng.random() < 0.3 else None
            outcome = deliver(n, fails, delay, attempt)
            tally["again:" + outcome] = tally.get("again:" + outcome, 0) + 1

    async def cancelled(n: int, fails: bool, delay: float) -> str:
        async def one() -> None:
            async with effectq.run(f"fuzz-{n}", store=store):
                await apply_async(n, fails)

        try:
            await asyncio.wait_for(one(), delay)
            return "returned"
        except TimeoutError:
            return "cancelled"
        except ValueError:
            return "raised"
        except PARKED as exc:
            return type(exc).__name__

    async def async_phase() -> None:
        nonlocal interrupted
        for n in range(calls, calls + ASYNC_CALLS):
            fails = rng.random() < 0.1
            outcome = await cancelled(n, fails, rng.uniform(0.0, 2.0 * span))
            tally["async:" + outcome] = tally.get("async:" + outcome, 0) + 1
            if outcome == "cancelled":
                interrupted += 1
                again = await cancelled(n, fails, 30.0)
                tally["async-again:" + again] = tally.get("async-again:" + again, 0) + 1

    asyncio.run(async_phase())

    deadline = time.monotonic() + 30.0  # the writes handed to the heartbeat land
    while heartbeat.pending()[1] and time.monotonic() < deadline:
        time.sleep(0.05)

    applied: dict[str, int] = {}
    for key in ledger:
        applied[key] = applied.get(key, 0) + 1
    keys: dict[str, int] = {}
    for n in range(calls + ASYNC_CALLS):
        with effectq.run(f"fuzz-{n}", store=store):
            effect = apply if n < calls else apply_async
            keys[effect.key(n, False)] = n  # type: ignore[attr-defined]
            keys[effect.key(n, True)] = n  # type: ignore[attr-defined]
    records = {record.key: record for record in store.scan()}
    problems: list[str] = []
    kinds: dict[str, int] = {}
    false_unknowns: list[str] = []  # maybe applied, though it never ran: cut on its way in
    for key, n in keys.items():
        cause = "TimeLimit" if n < calls else "CancelledError"
        record = store.get(key)
        count = applied.get(key, 0)
        status = record.status.value if record is not None else "absent"
        what = "applied" if count else ("ran" if key in started else "never-ran")
        kinds[f"{what}:{status}"] = kinds.get(f"{what}:{status}", 0) + 1
        if what != "ran" and status == "unknown":
            false_unknowns.append(f"{n} {what}: {landed.get(str(n))}")
        where = f" (the limit landed at: {landed.get(str(n))}; the record: {record})"
        if count > 1:
            problems.append(f"{key} applied {count} times")
        wrong = [k for k in tally if k.startswith("returned ") and k.endswith(f" for {n}")]
        if wrong:
            problems.append(f"{key}: a call of it {wrong}")
        if record is not None and record.status is effectq.Status.DISPATCHED:
            problems.append(f"{key} ({what}) left dispatched{where}")
        if count and record is not None and record.status is effectq.Status.FAILED:
            problems.append(f"{key} applied but parked: its result is lost{where}")
        if count and (record is None or record.status is effectq.Status.RELEASED):
            problems.append(f"{key} applied but {status}: the next call would apply it again{where}")
        if record is not None and record.status is effectq.Status.UNKNOWN and cause not in record.error:
            problems.append(f"{key} ({what}) unknown without the limit as cause: {record.error}{where}")
        if record is not None and record.status is effectq.Status.COMPLETED:
            if not count:
                problems.append(f"{key} completed, never applied")
            elif record.result_state is not effectq.ResultState.STORED or record.result != b"%d" % n:
                problems.append(
                    f"{key} completed with {record.result_state.value} {record.result!r}, not {n}{where}"
                )
    strays = [k for k, r in records.items() if r.status is effectq.Status.DISPATCHED]
    if strays:
        problems.append(f"dispatched records besides: {strays[:5]}")
    for k in list(client.scan_iter(match=f"effectq:{{{namespace}*")):
        client.delete(k)
    return {
        "seed": seed,
        "span_us": round(span * 1e6),
        "interrupted": interrupted,
        "applied": len(applied),
        "deliveries": tally,
        "records": kinds,
        "problems": problems,
        "pending_after": heartbeat.pending(),
        "false_unknowns": false_unknowns[:20],
    }


if __name__ == "__main__":
    url, ns, fuzz_seed, fuzz_calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(_fuzz(url, ns or f"fuzz{uuid.uuid4().hex[:8]}", fuzz_seed, fuzz_calls)))
