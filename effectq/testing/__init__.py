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

Each name loads when asked for: the suites import pytest, so worker processes
that use the ledger or faults need no pytest, and a pytest run that uses none
of the plugin's fixtures loads nothing of effectq but the plugin.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .contract import StoreContract
    from .faults import Action, Crash, Fault, FaultyStore, Point
    from .ledger import Ledger, Verdict, assert_exactly_once, verdict
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
    "Action": "faults",
    "Crash": "faults",
    "Fault": "faults",
    "FaultyStore": "faults",
    "Point": "faults",
    "Ledger": "ledger",
    "Verdict": "ledger",
    "assert_exactly_once": "ledger",
    "verdict": "ledger",
    "StoreContract": "contract",
    "OperatorStoreContract": "operators",
    "Seeded": "operators",
    "seed_records": "operators",
}


if not TYPE_CHECKING:  # mypy reads the imports above, and flags a name that is not there

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib import import_module

        return getattr(import_module(f".{module}", __name__), name)
