"""The old path of :mod:`effectq.agents.tools`, which it re-exports; it keeps working."""

from .agents.tools import *  # noqa: F403
from .agents.tools import __all__ as __all__
