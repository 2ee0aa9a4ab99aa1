"""The effect procedure: claim, then replay, wait, reconcile or execute, then record.

The procedure is written once, as a generator that *yields operations* (a store
primitive, a wait, the function itself) and receives their results. Drivers
run it: :func:`drive_sync` calls everything directly, :func:`drive_async`
awaits (store calls go to a worker thread, so a slow Redis never blocks the
event loop), and the streaming drivers in :mod:`effectq.effect` iterate
generator effects. One state machine serves sync, async and generator effects;
:func:`run_sync` writes out a synchronous call's two common outcomes (a replay,
a first run that succeeds) without its generator frames and hands anything else
to the procedure's own step (``tests/test_paths_agree.py`` holds the two alike).

Round trips on a store where each primitive is one: a first-time effect costs
two (claim, complete), a replay one (claim). A store that waits for replicas
(``RedisStore(wait_replicas=N)``) pipelines the wait with the claim and the
completion, and raises when too few acknowledged: a claim is then given back
without running the function; a completion reaches the caller as
:class:`~effectq.errors.CompletionNotReplicatedError` carrying the result.
"""
