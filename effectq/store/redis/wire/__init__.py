"""Pipelined scripts on redis-py's connections: :mod:`.frames` (bytes, no I/O), :mod:`.sync`
and :mod:`.aio` (the same names, one for threads and one for event loops), :mod:`.redispy`
(the one module that reads redis-py's private attributes)."""
