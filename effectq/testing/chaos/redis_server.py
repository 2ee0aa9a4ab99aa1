"""A redis-server of the chaos run's own, on a free port, to restart mid-run.

Appendonly with ``appendfsync always``: every write is on disk before Redis
answers it, so a restart (even by SIGKILL) loses nothing a worker was told had
landed, as with a production Redis configured for durability.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RedisServer:
    """A durable redis-server the runner can restart.

    Args:
        directory: where its append-only file and log live.
        persistent: ``False``: no append-only file and no snapshots (a restart loses everything).
    """

    def __init__(self, directory: Path, *, persistent: bool = True) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("the Redis restart fault needs redis-server on PATH")
        self.binary = binary
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.persistent = persistent

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start it and wait until it answers (it replays its append-only file first)."""
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.persistent else "no",
                "--appendfsync",
                "always",
                "--dir",
                str(self.directory),
                "--logfile",
                str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn,
            ):
                conn.sendall(b"PING\r\n")
                if conn.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise RuntimeError(
            f"redis-server on port {self.port} did not answer (see {self.directory / 'redis.log'})"
        )

    def kill(self) -> None:
        """SIGKILL it (a frozen one too)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None

    def pause(self) -> None:
        """SIGSTOP it: connections stay open, nothing answers (a frozen VM, a stalled disk)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT it."""
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def restart(self, down_for: float = 0.5) -> None:
        """SIGKILL it, stay down ``down_for`` seconds, start it again."""
        self.kill()
        time.sleep(down_for)
        self.start()
        self.restarts += 1

    def stop(self) -> None:
        self.kill()
