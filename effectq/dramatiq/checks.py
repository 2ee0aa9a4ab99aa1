"""What a Dramatiq broker's set-up must give for effects to apply exactly once.

:func:`check` reads the broker's middleware and actors (and, given the store, what
its Redis would evict) and returns one sentence per problem;
:class:`~effectq.dramatiq.EffectMiddleware` logs them when a worker boots.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from ..integration import listed
from ..ops.doctor import startup_problems
from ..options import seconds

__all__ = ["ACTOR_OPTIONS", "check"]

ACTOR_OPTIONS = frozenset({"effectq_run_id", "effectq_task"})
"""The actor options effectq's middleware declares to Dramatiq (``Middleware.actor_options``): how
:func:`check` tells it in a broker's middleware, subclasses included, without importing it."""

_MAX_BACKOFF_MS = 7 * 86400 * 1000
"""The longest backoff Retries applies, whatever an actor asks for (Dramatiq's DEFAULT_MAX_BACKOFF)."""


def check(broker: Any, *, retention: float | timedelta = timedelta(days=7), store: Any = None) -> list[str]:
    """Problems in ``broker``'s set-up, one sentence each (empty when none).

    Args:
        broker: the Dramatiq broker, its actors declared.
        retention: the shortest effect retention the actors' effects use.
        store: the store the effects use: its Redis is checked as ``effectq doctor``
            checks it for what repeats effects whatever the broker does (see
            :data:`effectq.ops.doctor.STARTUP_CHECKS`: a ``maxmemory-policy`` that evicts).
    """
    retention_s = seconds(retention, option="retention")
    middleware = list(broker.middleware)
    names = [type(m).__name__ for m in middleware]
    ours = [i for i, m in enumerate(middleware) if set(m.actor_options) >= ACTOR_OPTIONS]
    problems: list[str] = []
    if "Retries" in names and ours and ours[0] < names.index("Retries"):
        problems.append(
            "EffectMiddleware is added before Retries, so an unknown outcome is retried until max_retries "
            "instead of failing at once; add it after Retries (the default)"
        )
    retries = middleware[names.index("Retries")] if "Retries" in names else None
    if retries is not None:
        late = []
        for name in sorted(broker.get_declared_actors()):
            horizon, max_backoff = _retry_horizon(retries, broker.get_actor(name).options)
            if horizon > retention_s:
                late.append((name, horizon, max_backoff))
        if late:
            horizon = max(h for _, h, _ in late)
            backoff = max(b for _, _, b in late)
            problems.append(
                f"{listed([n for n, _, _ in late])} may retry later than the effect retention "
                f"({retention_s / 86400:g} days): Retries may retry "
                f"{'without end' if math.isinf(horizon) else f'for up to {horizon / 86400:.3g} days'} "
                f"(max_retries, each backoff up to max_backoff={backoff}ms; or a retry_when), and an effect "
                f"whose record expired applies again on such a late retry. Bound max_retries and "
                f"max_backoff, or raise the effects' retention (EffectMiddleware(retention=...))."
            )
    if store is not None:
        problems.extend(startup_problems(store))
    return problems


def _retry_horizon(retries: Any, options: dict[str, Any]) -> tuple[float, int]:
    """An upper bound of how long after its first delivery a message may still be retried, in
    seconds, and the longest single backoff (ms): each backoff is at most twice
    ``min_backoff * 2**n`` (Dramatiq's jitter), and at most ``max_backoff``."""
    max_backoff = min(int(options.get("max_backoff", retries.max_backoff)), _MAX_BACKOFF_MS)
    if options.get("retry_when", retries.retry_when) is not None:
        return math.inf, max_backoff
    count = options.get("max_retries", retries.max_retries)
    if count is None:
        return math.inf, max_backoff
    factor = int(options.get("min_backoff", retries.min_backoff))
    total = 0
    backoff = 0
    for n in range(min(int(count), 33)):  # Dramatiq caps the exponent at 32
        backoff = min(2 * factor * 2**n, max_backoff)
        total += backoff
    total += max(0, int(count) - 33) * backoff
    return total / 1000, max_backoff
