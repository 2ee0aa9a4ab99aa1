"""The old path of :mod:`effectq.ops.admin`, which it re-exports; it keeps working."""

from .ops.admin import *  # noqa: F403
from .ops.admin import __all__ as __all__
