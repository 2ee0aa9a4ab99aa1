"""The chaos runner's old home: it lives in :mod:`effectq.testing.chaos` now.

``python -m effectq.chaos`` and ``effectq chaos`` still run it; ``effectq.chaos.workload`` and
``effectq.chaos.proxy`` are the same modules as ``effectq.testing.chaos.workload`` and ``.proxy``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos runner with command-line arguments; returns the exit status."""
    from effectq.testing.chaos import main as run

    return run(argv)
