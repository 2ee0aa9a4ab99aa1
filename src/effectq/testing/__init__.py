"""Testing helpers for effectq users and store authors.

:class:`StoreContract` is the suite every store passes; subclass it to test a
store of your own. :class:`OperatorStoreContract` is the suite of the operator
primitives (listing, summary, purge), and :func:`seed_records` writes one
record of every kind, for tests of tools built on them.
:mod:`effectq.testing.ledger` is an external record of applications to judge
"exactly once" by; :mod:`effectq.testing.workers` starts and kills real Celery
and Dramatiq workers. The suites import pytest, so they load when asked for:
worker processes that use the ledger need no pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .contract import StoreContract
    from .operators import OperatorStoreContract, Seeded, seed_records

__all__ = ["OperatorStoreContract", "Seeded", "StoreContract", "seed_records"]

_LAZY = {
    "StoreContract": "contract",
    "OperatorStoreContract": "operators",
    "Seeded": "operators",
    "seed_records": "operators",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)
