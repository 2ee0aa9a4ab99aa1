"""Testing helpers for effectq users and store authors (also a pytest plugin).

* Fixtures (``effectq_store``, ``effectq_run``, ``effectq_deliver``, ``effectq_ledger``,
  ``effectq_clock``) come from :mod:`effectq.testing.plugin`, registered through
  the ``pytest11`` entry point.
* :class:`FaultyStore`, :class:`Fault`, :class:`Point`, :class:`Action`,
  :class:`Crash`: fault injection at named points of an effect's life.
* :class:`Ledger` (the remote system, on Redis) and :func:`assert_exactly_once`.
* :class:`StoreContract`: the suite every store passes; subclass it to test a
  store of your own. :class:`OperatorStoreContract` is the suite of the operator
  primitives (listing, summary, purge), and :func:`seed_records` writes one
  record of every kind, for tests of tools built on them.
* :mod:`effectq.testing.workers`: real Celery and Dramatiq workers to kill.

The suites import pytest, so they load when asked for: worker processes that
use the ledger or faults need no pytest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .faults import Action, Crash, Fault, FaultyStore, Point
from .ledger import Ledger, Verdict, assert_exactly_once, verdict

if TYPE_CHECKING:
    from .contract import StoreContract
    from .operators import OperatorStoreContract, Seeded, seed_records

__all__ = [
    "Action",
    "Crash",
    "Fault",
    "FaultyStore",
    "Ledger",
    "OperatorStoreContract",
    "Point",
    "Seeded",
    "StoreContract",
    "Verdict",
    "assert_exactly_once",
    "seed_records",
    "verdict",
]

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
