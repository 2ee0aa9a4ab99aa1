"""effectq's suite. ``conftest.py`` here gives every test its Redis and namespace.

* ``unit/``: the library on its own, or on the suite's Redis through the fixtures.
* ``redis/``: the Redis store: wire, layout, indexes, lost and late replies.
* ``cluster/``: Cluster, replicas and Sentinel, on servers each test starts.
* ``processes/``: real processes killed, signalled and timed out; the chaos runner.
* ``integrations/``: Celery (``celery/``) and Dramatiq (``dramatiq/``), real workers where it
  matters; a test of both sits at the top.
* ``typing/``: how user code type-checks (read by mypy, not run).
* ``support/``: what several tests share: servers, child programs, worker apps, a worker rig.

Tests import shared code absolutely (``from tests.support.servers import Server``); a child
process runs as ``python -m tests.support.procs`` from the checkout.
"""
