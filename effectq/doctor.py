"""The old path of :mod:`effectq.ops.doctor`, which it re-exports; it keeps working."""

from .ops.doctor import *  # noqa: F403
from .ops.doctor import __all__ as __all__
