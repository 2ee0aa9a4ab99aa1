"""Testing helpers for effectq users and store authors.

:class:`StoreContract` is the suite every store passes; subclass it to test a
store of your own.
"""

from __future__ import annotations

from .contract import StoreContract

__all__ = ["StoreContract"]
