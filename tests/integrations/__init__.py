"""The task queues, with real workers where it matters; a test of both frameworks sits here."""
