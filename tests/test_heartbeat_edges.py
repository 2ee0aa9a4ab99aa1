"""The heartbeat's retried writes at their edges: spread out in time.

Retries of many workers that failed together are jittered, so they do not all
come back at once.
"""

from __future__ import annotations

import random

from effectq.heartbeat import BACKOFF_BASE, BACKOFF_CAP, backoff

# -- jitter ---------------------------------------------------------------------------------


def test_retry_delays_are_jittered_over_the_whole_backoff_window() -> None:
    """Each retry's delay is drawn over (0, bound], the bound doubling from BACKOFF_BASE up to
    BACKOFF_CAP: workers that failed together spread their retries instead of coming back at once."""
    rng = random.Random(20)
    for attempt in range(12):
        bound = min(BACKOFF_CAP, BACKOFF_BASE * 2**attempt)
        delays = [backoff(attempt, rng) for _ in range(400)]
        assert all(0 < d <= bound for d in delays), attempt
        assert len(set(delays)) == len(delays)  # no two workers alike
        assert min(delays) < 0.1 * bound and max(delays) > 0.9 * bound, attempt  # the whole window
        quarters = [sum(q * bound / 4 < d <= (q + 1) * bound / 4 for d in delays) for q in range(4)]
        assert min(quarters) > 60, (attempt, quarters)  # spread evenly, not bunched
    assert backoff(1000, rng) <= BACKOFF_CAP
