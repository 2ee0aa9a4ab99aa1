"""What the code beside the decorator needs of an effect: :class:`Wrapped`.

The switch (:mod:`.switch`, effects as plain functions) and the outcome calls
(:mod:`.outcome_calls`, a mixin of :class:`~effectq.Effect`) take an effect as this
protocol, so neither imports :mod:`.effect`, which imports both.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

from ._engine.calls import Callee

__all__ = ["Wrapped"]


class Wrapped(Callee, Protocol):
    """An effect as its function's callers see it (:class:`effectq.Effect` is one): besides what
    the engine needs (name, options, codec), the function, how it is invoked (``"sync"``,
    ``"async"``, ``"gen"`` or ``"async_gen"``), its signature, and the arguments of its key."""

    @property
    def fn(self) -> Callable[..., Any]: ...

    @property
    def _invoke_kind(self) -> str: ...

    @property
    def _signature(self) -> inspect.Signature: ...

    def _keyed(self, arguments: dict[str, Any]) -> dict[str, Any]: ...
