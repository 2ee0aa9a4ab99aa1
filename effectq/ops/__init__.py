"""What an operator does, as a library: the command line is a thin shell over it.

* :mod:`effectq.ops.admin`: list, show, resolve, stats and purge records.
* :mod:`effectq.ops.doctor`: what in a Redis deployment breaks "at most once".

``effectq.admin`` and ``effectq.doctor`` are the same, by their old paths.
"""
