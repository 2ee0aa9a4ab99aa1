"""The old path of :mod:`effectq.agents.pydantic_ai`, which it re-exports; it keeps working."""

from .agents.pydantic_ai import *  # noqa: F403
from .agents.pydantic_ai import __all__ as __all__
