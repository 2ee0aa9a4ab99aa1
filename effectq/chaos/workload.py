"""The same module as :mod:`effectq.testing.chaos.workload` (imported under its old name)."""

from __future__ import annotations

import importlib
import sys

sys.modules[__name__] = importlib.import_module("effectq.testing.chaos.workload")
