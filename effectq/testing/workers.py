"""Real worker processes for crash tests: start, SIGKILL, SIGSTOP, restart.

A :class:`WorkerProcess` is one ``celery worker`` or ``dramatiq`` process running
:mod:`effectq.testing.chaos.workload`, in its own process group so a kill takes its pool
children with it. A :class:`Producer` sends the workload's tasks and, at the end,
deletes every queue and key the run created (never anything else). The tests of
the Celery and Dramatiq integrations and the chaos runner share both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .chaos.config import WorkloadConfig

__all__ = ["Producer", "WorkerProcess", "delete_keys", "wait_until"]


def wait_until(condition: Callable[[], Any], *, timeout: float, interval: float = 0.1, what: str = "") -> Any:
    """Poll ``condition`` until it returns something truthy; raise TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"gave up after {timeout:g}s waiting for {what or condition!r}")
        time.sleep(interval)


def delete_keys(client: Any, pattern: str) -> int:
    """Delete the keys matching ``pattern`` (SCAN, never FLUSH). Returns how many."""
    batch = list(client.scan_iter(match=pattern, count=1000))
    for i in range(0, len(batch), 500):
        client.delete(*batch[i : i + 500])
    return len(batch)


class WorkerProcess:
    """One real worker process of the chaos workload.

    Args:
        config: the workload configuration (passed through the environment).
        name: a name for logs and the Celery node name.
        log_dir: where the worker's output goes (``<name>.log``, appended across restarts).
        pool: Celery's pool (``solo``, ``prefork``, ``threads``); ignored for Dramatiq.
        concurrency: Celery pool size, or Dramatiq threads.
    """

    def __init__(
        self, config: WorkloadConfig, name: str, *, log_dir: Path, pool: str = "solo", concurrency: int = 1
    ) -> None:
        self.config = config
        self.name = name
        self.pool = pool
        self.concurrency = concurrency
        self.log_path = Path(log_dir) / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.paused = False

    def __repr__(self) -> str:
        return f"<worker {self.name} pid={self.pid}>"

    def command(self) -> list[str]:
        if self.config.kind == "celery":
            return [
                sys.executable, "-m", "celery", "-A", f"{self.config.module}:app", "worker",
                "-P", self.pool, "-c", str(self.concurrency), "-Q", self.config.queue,
                "-n", f"{self.name}-{uuid.uuid4().hex[:6]}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO",
            ]  # fmt: skip
        return [
            sys.executable, "-m", "dramatiq", self.config.module,
            "--processes", "1", "--threads", str(self.concurrency), "--queues", self.config.queue,
        ]  # fmt: skip

    def start(self) -> None:
        """Start the process (again, after a kill)."""
        if self.alive:
            raise RuntimeError(f"{self} is already running")
        env = {**os.environ, **self.config.to_env(), "PYTHONUNBUFFERED": "1"}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- start {self.starts + 1} ---\n".encode())
            self.process = subprocess.Popen(
                self.command(), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.starts += 1
        self.paused = False

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """SIGKILL the worker and every process of its group (pool children too); wait for it."""
        self._signal_group(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)
        self.paused = False

    def pause(self) -> None:
        """SIGSTOP the whole group: it holds its leases without renewing them."""
        self._signal_group(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT the group."""
        self._signal_group(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 15.0) -> None:
        """Ask the worker to stop (SIGTERM), then SIGKILL what is left."""
        if self.process is None:
            return
        if self.paused:
            self.resume()
        if self.alive:
            self._signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout)
        self._signal_group(signal.SIGKILL)  # children a graceful stop left behind
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)

    def log_tail(self, lines: int = 40) -> str:
        """The end of the worker's output, for a failure message."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Producer:
    """Sends the workload's tasks, and deletes what the run created on the brokers.

    Args:
        config: the workload configuration the workers use.
    """

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        self._send: Callable[[int, int, int, float, int, float], None]
        self._send_chord: Callable[[list[int], int, int, float], str] | None = None
        self._send_callback: Callable[[int, str], None] | None = None
        self._close: Callable[[], None]
        if config.kind == "celery":
            self._celery()
        else:
            self._dramatiq()

    def _celery(self) -> None:
        from celery import Celery

        config = self.config
        app = Celery(f"effectq-chaos-producer-{config.name}", broker=config.broker, set_as_current=False)
        app.conf.update(
            broker_transport_options={"global_keyprefix": config.prefix},
            task_default_queue=config.queue,
            broker_connection_retry_on_startup=True,
            **config.results(),
        )

        def send(
            task_no: int, effects: int, hold_after: int, pause: float, retry_after: int, countdown: float
        ) -> None:
            app.send_task(
                "chaos.work",
                args=(task_no, effects, hold_after, pause, retry_after),
                queue=config.queue,
                countdown=countdown or None,
            )

        def send_chord(task_nos: list[int], callback_no: int, effects: int, pause: float) -> str:
            from celery import chord, signature

            header = [
                signature("chaos.work", args=(t, effects, 0, pause, 0), app=app, queue=config.queue)
                for t in task_nos
            ]
            body = signature("chaos.chord_done", kwargs={"task_no": callback_no}, app=app, queue=config.queue)
            return str(chord(header, app=app)(body).parent.id)

        def send_callback(callback_no: int, group_id: str) -> None:
            app.send_task(
                "chaos.chord_done",
                args=([],),
                kwargs={"task_no": callback_no},
                queue=config.queue,
                group_id=group_id,
            )

        self._send = send
        self._send_chord = send_chord
        self._send_callback = send_callback
        self._close = app.close

    def _dramatiq(self) -> None:
        import dramatiq

        config = self.config
        broker: Any
        if config.broker.startswith("amqp"):
            from dramatiq.brokers.rabbitmq import RabbitmqBroker

            broker = RabbitmqBroker(url=config.broker, middleware=[])
        else:
            from dramatiq.brokers.redis import RedisBroker

            broker = RedisBroker(  # type: ignore[no-untyped-call]
                url=config.broker, namespace=f"effectq-chaos-{config.name}", middleware=[]
            )
        broker.declare_queue(config.queue)

        def send(
            task_no: int, effects: int, hold_after: int, pause: float, retry_after: int, countdown: float
        ) -> None:
            message: dramatiq.Message[Any] = dramatiq.Message(
                queue_name=config.queue,
                actor_name="chaos_work",
                args=(task_no, effects, hold_after, pause, retry_after),
                kwargs={},
                options={},
            )
            broker.enqueue(message, delay=int(countdown * 1000) or None)

        self._send = send
        self._close = broker.close

    def send(
        self,
        task_no: int,
        effects: int,
        *,
        hold_after: int = 0,
        pause: float = 0.0,
        retry_after: int = 0,
        countdown: float = 0.0,
    ) -> None:
        """Enqueue task ``task_no`` with ``effects`` effects, due ``countdown`` seconds from now
        (see :func:`effectq.testing.chaos.workload.work`)."""
        self._send(task_no, effects, hold_after, pause, retry_after, countdown)

    def send_chord(self, task_nos: list[int], callback_no: int, effects: int, *, pause: float = 0.0) -> str:
        """Enqueue a chord (Celery, with ``config.chord``): header tasks ``task_nos`` of ``effects``
        effects each, and the callback ``chaos.chord_done`` as task ``callback_no``. Returns the
        chord's group id."""
        if self._send_chord is None:
            raise RuntimeError("chords need Celery")
        return self._send_chord(task_nos, callback_no, effects, pause)

    def send_callback(self, callback_no: int, group_id: str) -> None:
        """Send a chord's callback again, in the chord's group ``group_id`` (as an application's
        reconciler would when the chord's header finished and its callback never came)."""
        if self._send_callback is None:
            raise RuntimeError("chords need Celery")
        self._send_callback(callback_no, group_id)

    def close(self) -> None:
        self._close()

    def cleanup(self) -> None:
        """Delete this run's queues (RabbitMQ) or keys (Redis brokers), the store namespace and the ledger."""
        import redis

        config = self.config
        with contextlib.suppress(Exception):
            self.close()
        if config.broker.startswith("amqp"):
            _delete_rabbitmq(config.broker, config.queue, dramatiq=config.kind == "dramatiq")
        else:
            client = redis.Redis.from_url(config.broker)
            delete_keys(client, f"{config.prefix}*")
            client.close()
        for url, patterns in (
            (config.store, (f"effectq:{{{config.name}:*", f"effectq:{{{config.name}}}*")),
            (config.ledger, (f"effectq-ledger:{{{config.name}}}*", f"{config.prefix}*")),
        ):
            with contextlib.suppress(Exception):
                client = redis.Redis.from_url(url, socket_connect_timeout=2)
                for pattern in patterns:
                    delete_keys(client, pattern)
                client.close()


def _delete_rabbitmq(url: str, queue: str, *, dramatiq: bool) -> None:
    import pika

    queues = [queue, f"{queue}.DQ", f"{queue}.XQ"] if dramatiq else [queue]
    if url.endswith("//"):  # kombu's spelling of the default vhost; pika's is %2F
        url = url[:-1] + "%2F"
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for name in queues:
            channel = connection.channel()
            with contextlib.suppress(Exception):
                channel.queue_delete(name)
        if not dramatiq:  # Celery declares a direct exchange named after its default queue
            channel = connection.channel()
            with contextlib.suppress(Exception):
                channel.exchange_delete(queue)
    finally:
        with contextlib.suppress(Exception):
            connection.close()


@contextlib.contextmanager
def workers(
    config: WorkloadConfig, count: int, *, log_dir: Path, **options: Any
) -> Iterator[list[WorkerProcess]]:
    """Start ``count`` workers; stop them all (whatever state they are in) on exit."""
    started = [WorkerProcess(config, f"w{i}", log_dir=log_dir, **options) for i in range(count)]
    try:
        for worker in started:
            worker.start()
        yield started
    finally:
        for worker in started:
            worker.stop()
