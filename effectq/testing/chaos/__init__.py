"""The chaos runner: real workers killed at random, effects counted on a ledger.

Run it with ``python -m effectq.chaos --help`` or ``effectq chaos --help``;
:func:`main` is the entry point both use. Importing this package stays light:
worker processes import :mod:`effectq.testing.chaos.workload` under it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chaos runner with command-line arguments; returns the exit status."""
    from .__main__ import main as run

    return run(argv)
