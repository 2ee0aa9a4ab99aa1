"""Testing helpers for effectq users and store authors.

:class:`StoreContract` is the suite every store passes; subclass it to test a
store of your own. :class:`OperatorStoreContract` is the suite of the operator
primitives (listing, summary, purge), and :func:`seed_records` writes one
record of every kind, for tests of tools built on them.
"""

from __future__ import annotations

from .contract import StoreContract
from .operators import OperatorStoreContract, Seeded, seed_records

__all__ = ["OperatorStoreContract", "Seeded", "StoreContract", "seed_records"]
