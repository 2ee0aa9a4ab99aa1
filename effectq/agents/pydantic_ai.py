"""pydantic-ai: model requests as journaled steps, so a redelivered agent neither re-pays nor re-plans.

    from effectq.agents.pydantic_ai import DurableModel

    agent = Agent(
        DurableModel("openai:gpt-5"),
        tools=effectq.wrap_tools([lookup_order, refund], effects=["refund"]),
    )

    with effectq.run(task_id, store=store):
        agent.run_sync(prompt)

Inside a bound run, the Nth model request of the run returns the journaled
response of the Nth request of an earlier attempt without calling the model,
so the agent plans the same tool calls again, and the side-effecting tools
(wrapped by :func:`effectq.wrap_tools`) return their recorded results. The
first request that never completed is the first one paid for again.

A replayed request is compared with the journaled one by what was asked (the
kinds, contents, tool names, arguments and call ids of the messages), not by
timestamps or pydantic-ai's per-run ids, which differ in every attempt. Only
``request`` is journaled: a streamed request (``agent.run_stream``, or an
``event_stream_handler``) raises rather than run un-journaled.

Needs ``pip install 'effectq[agents]'``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError
from ..options import OnMismatch
from .steps import LEASE, RETENTION, WAIT, step

try:
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models import Model, ModelRequestParameters, StreamedResponse
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("effectq.agents.pydantic_ai needs pydantic-ai: pip install 'effectq[agents]'") from exc

__all__ = ["DurableModel", "transcript"]

_PART_FIELDS = ("tool_name", "tool_call_id", "content", "args")


def transcript(messages: list[ModelMessage]) -> list[dict[str, Any]]:
    """What a request asks the model, without what differs between attempts.

    Timestamps, pydantic-ai's run and conversation ids, usage and provider
    details are left out; kinds, instructions, contents, tool names, arguments
    and tool-call ids stay.
    """
    return [
        {
            "kind": message.kind,
            "instructions": getattr(message, "instructions", None),
            "parts": [
                {"kind": part.part_kind, **{f: getattr(part, f) for f in _PART_FIELDS if hasattr(part, f)}}
                for part in message.parts
            ],
        }
        for message in messages
    ]


class DurableModel(WrapperModel):
    """A model whose requests are journaled steps of the bound effectq run.

    Args:
        wrapped: the model, or a model name pydantic-ai knows.
        name: the step name, part of the journal key. Give two agents of one run
            different names when the order of their requests can vary.
        on_mismatch: ``"warn"`` (the default) or ``"raise"``
            (:class:`~effectq.StepDivergedError`) when a replayed request differs
            from the journaled one.
        lease: how long a redelivered run waits for a dead holder's request.
        wait: how long a request waits for the same request in flight elsewhere.
        retention: how long the journal keeps a response.
    """

    def __init__(
        self,
        wrapped: Model | str,
        *,
        name: str = "agent.model",
        on_mismatch: OnMismatch | str = OnMismatch.WARN,
        lease: float | timedelta = LEASE,
        wait: float | timedelta = WAIT,
        retention: float | timedelta = RETENTION,
    ) -> None:
        super().__init__(wrapped)
        self.step = step(
            name=name,
            key_args=("asked",),
            on_mismatch=on_mismatch,
            lease=lease,
            wait=wait,
            retention=retention,
            result_type=ModelResponse,
        )(self._request)

    async def _request(
        self,
        asked: list[dict[str, Any]],
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        return await self.wrapped.request(messages, model_settings, model_request_parameters)

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """The journaled response of this request's ordinal, or the model's (then journaled)."""
        response: ModelResponse = await self.step(
            transcript(messages), messages, model_settings, model_request_parameters
        )
        return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        """Refused: a streamed request would not be journaled."""
        raise ConfigurationError(
            f"{self.step.name}: DurableModel journals agent.run() requests; a streamed request "
            f"(run_stream, or an event_stream_handler) would not be journaled. Use agent.run()."
        )
        yield  # pragma: no cover
