"""The effect procedure: claim, then replay, wait, reconcile or execute, then record.

The procedure (:mod:`.procedure`) is written once, as a generator that *yields
operations* (:mod:`.ops`: a store primitive, a wait, the function itself) and
receives their results; every decision it takes is a plain function of
:mod:`.decide`. The drivers of :mod:`.drive` are the only loops that run it:
blocking, awaited in an event loop (store calls on the store's async twin, or in a
worker thread, so a slow Redis never blocks the loop), and the two that stream a
generator effect's items. One state machine serves sync, async and generator effects.

Round trips on a store where each primitive is one: a first-time effect costs
two (claim, complete), a replay one (claim). A store that waits for replicas
(``RedisStore(wait_replicas=N)``) pipelines the wait with the claim and the
completion, and raises when too few acknowledged: a claim is then given back
without running the function; a completion reaches the caller as
:class:`~effectq.errors.CompletionNotReplicatedError` carrying the result.
"""
