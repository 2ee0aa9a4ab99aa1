"""Pipelined scripts on redis-py's connections: :mod:`.frames` (bytes, no I/O), :mod:`.sync`
and :mod:`.aio` (the same names, one for threads and one for event loops), :mod:`.posted`
(pending replies, as both keep and settle them), :mod:`.loops` (what the asyncio wire keeps
on each loop), :mod:`.clients` (which clients the wire serves) and :mod:`.redispy` (the one
module that reads redis-py's private attributes)."""
