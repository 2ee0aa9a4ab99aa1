"""``python -m effectq.chaos``: the same as ``python -m effectq.testing.chaos``."""

from __future__ import annotations

import sys

from effectq.testing.chaos.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
