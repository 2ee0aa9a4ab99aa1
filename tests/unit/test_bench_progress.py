"""bench/run.py says what it is doing while it runs: a line per step, and one every few seconds."""

from __future__ import annotations

import io
import threading

from bench.run import STEPS, Progress


class _Lines(io.StringIO):
    """A stream that signals each line written."""

    def __init__(self) -> None:
        super().__init__()
        self.wrote = threading.Event()

    def write(self, text: str) -> int:
        done = super().write(text)
        self.wrote.set()
        return done


def test_a_line_when_each_step_starts_and_while_it_runs() -> None:
    out = _Lines()
    progress = Progress(("warm", "measure"), every=0.01, out=out)
    try:
        with progress.step("warm"):
            while out.getvalue().count("warm (1/2)") < 3:  # the start line, then the ticks
                assert out.wrote.wait(60)
                out.wrote.clear()
        with progress.step("measure"):
            pass
    finally:
        progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("[bench ") and lines[0].endswith("warm (1/2), 0 s in this step")
    assert any("measure (2/2)" in line for line in lines)
    assert all(line.startswith("[bench ") for line in lines)


def test_every_step_of_the_run_is_named() -> None:
    assert len(STEPS) == len(set(STEPS)) == 9
