"""The one place a redis-py error becomes an effectq error.

Every call of the Redis store that fails ends here: a worker's time limit (see
:func:`effectq.options.is_time_limit`) passes as it is, the task's to handle and
no failure of Redis; ``WRONGTYPE`` is a :class:`~effectq.errors.CorruptRecordError`;
anything else a :class:`~effectq.errors.StoreError` that says whether the request
may have reached Redis (:attr:`~effectq.errors.StoreError.sent`). Only the wire
knows when nothing was written; it marks such an exception with :func:`mark_unsent`.
"""

from __future__ import annotations

import contextlib
from typing import NoReturn

from ...errors import CorruptRecordError, StoreError
from ...options import is_time_limit

__all__ = ["failure", "mark_unsent", "raise_failure", "raise_operator_failure", "sent"]

_UNSENT = "_effectq_unsent"
"""Set on an exception that stopped a script before any of it was written."""


def sent(exc: BaseException) -> bool:
    """Whether the script that failed with ``exc`` may have reached Redis. False only when the
    wire knows nothing of it was written (no connection could be had or opened): Redis cannot
    have run it."""
    return getattr(exc, _UNSENT, False) is not True


def mark_unsent(exc: BaseException, unsent: bool = True) -> BaseException:
    """Mark ``exc`` as having stopped a script before any of it was written (or, with
    ``unsent=False``, as one after which it may have landed)."""
    with contextlib.suppress(AttributeError):  # an exception type without a __dict__
        setattr(exc, _UNSENT, unsent)
    return exc


def failure(op: str, key: str, exc: BaseException) -> StoreError:
    """What a store call ``op`` on ``key`` that failed with ``exc`` means."""
    text = str(exc)
    if "WRONGTYPE" in text:
        return CorruptRecordError(key, f"the Redis key holds another type: {text}")
    error = StoreError(f"effectq {op} failed on Redis for key {key!r}: {type(exc).__name__}: {text}")
    error.sent = sent(exc)
    return error


def raise_failure(op: str, key: str, exc: BaseException) -> NoReturn:
    """Raise :func:`failure`; or ``exc`` itself when it is a worker's time limit."""
    if is_time_limit(exc):
        raise exc
    raise failure(op, key, exc) from exc


def raise_operator_failure(op: str, exc: BaseException) -> NoReturn:
    """An operator call's (listing, summary, purge) :class:`StoreError`, or the time limit as it is."""
    if is_time_limit(exc):
        raise exc
    raise StoreError(f"effectq {op} failed on Redis: {type(exc).__name__}: {exc}") from exc
