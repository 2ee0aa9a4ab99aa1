"""The effects both example apps share: a charge and a receipt, applied to a Redis list.

``examples:outbox`` plays the payment provider and the mailer; read it with
``redis-cli lrange examples:outbox 0 -1``. A task waits ``EXAMPLE_PAUSE`` seconds (5 unless set)
between the two, time to kill its worker.
"""

from __future__ import annotations

import os

import redis

import effectq

REDIS = os.environ.get("EXAMPLE_REDIS", "redis://127.0.0.1:6379/0")
PAUSE = float(os.environ.get("EXAMPLE_PAUSE", "5"))
"""Seconds a task waits between the charge and the receipt: time to kill its worker."""

outbox = redis.Redis.from_url(REDIS)


@effectq.effect(name="payments.charge")
def charge(order_id: int, cents: int) -> str:
    """Charge the customer; the provider gets a stable idempotency key."""
    key = effectq.current_effect().idempotency_key
    outbox.rpush("examples:outbox", f"charge order {order_id}: {cents} cents (idempotency key {key})")
    return f"ch_{order_id}"


@effectq.effect(name="email.receipt")
def email_receipt(order_id: int, charge_id: str) -> None:
    """Email the receipt."""
    outbox.rpush("examples:outbox", f"receipt for order {order_id} ({charge_id})")
