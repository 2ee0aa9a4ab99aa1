"""The chaos runner: real workers killed at random, effects counted on a ledger.

Run it with ``python -m effectq.chaos --help``.
"""
