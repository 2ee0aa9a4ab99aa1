"""effectq for Dramatiq: one middleware.

    from effectq.dramatiq import EffectMiddleware

    broker = RabbitmqBroker(url="amqp://guest:guest@127.0.0.1:5672")
    broker.add_middleware(EffectMiddleware("redis://127.0.0.1:6379/0", namespace="shop"))
    dramatiq.set_broker(broker)

    @dramatiq.actor(effectq_run_id="order:{order_id}")
    def fulfil(order_id):
        charge(order_id)        # an @effectq.effect: applies once per run
        send_receipt(order_id)

Needs ``pip install 'effectq[dramatiq]'``.
"""

from __future__ import annotations

try:
    import dramatiq as _dramatiq  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("effectq.dramatiq needs Dramatiq: pip install 'effectq[dramatiq]'") from exc

from .checks import check
from .middleware import EffectMiddleware, RunNotBoundError

__all__ = ["EffectMiddleware", "RunNotBoundError", "check"]
