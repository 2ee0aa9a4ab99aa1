"""The old path of :mod:`effectq.agents.steps`, which it re-exports; it keeps working."""

from .agents.steps import *  # noqa: F403
from .agents.steps import __all__ as __all__
