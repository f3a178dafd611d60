"""pydantic-ai agents whose every model request and tool call is a step of a durable run.

    from pydantic_ai import Agent
    from django_durable.contrib.pydantic_ai import DjangoDurability, run_agent

    support = Agent("openai:gpt-5", name="support", capabilities=[DjangoDurability()])

    @durable.workflow("support.answer")
    def answer(ctx, question):
        return run_agent(ctx, support, question)

Built on pydantic-ai's own extension point for durable engines (``BaseDurabilityCapability``
with a callable operation backend): pydantic-ai hands each durable unit of the agent's run — a
model request, a tool call, a tool's argument check, an event for the run's event handler — to
``DjangoDurabilityBackend.execute``, which runs it as ``ctx.astep()`` under a key made of the
unit's name and how many units of that name the run reached before (``support__model.request:1``).
A replay returns the recorded result; a worker that dies mid-agent resumes with its completed
model requests and tool calls replayed from the journal, and the one in flight run again.
Results cross as JSON (pydantic-ai's JSON codec), so the journal holds them as any step's.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from pydantic_ai.durable_exec._base import BaseDurabilityCapability
from pydantic_ai.durable_exec._codec import JSON_CODEC
from pydantic_ai.durable_exec._operation import DurableOperationId
from pydantic_ai.durable_exec._operation_backend import JournalCallableOperationBackend, RoleBasedOperationConfig
from pydantic_ai.durable_exec._spec import DurabilityEngineSpec

from ..exceptions import NonRetryableError

# The run an agent runs in now: its context and the count of units reached, by name.
_bound: contextvars.ContextVar[tuple[Any, dict[str, int]] | None] = contextvars.ContextVar(
    "durable_agent_run", default=None)


def _not_json(exc: Exception) -> BaseException:
    return NonRetryableError(f"A value of the agent's run cannot be stored as JSON: {exc}")


class DjangoDurabilityBackend(JournalCallableOperationBackend[dict]):
    """Each durable unit of an agent's run as one step of the workflow that runs the agent."""

    async def execute(self, *, operation_id: DurableOperationId, name: str, body: Callable[[], Awaitable[object]],
                      cache_key: tuple[object, ...], config: dict) -> object:
        bound = _bound.get()
        if bound is None:
            raise RuntimeError("An agent with DjangoDurability runs in a workflow, through run_agent(ctx, agent, ...).")
        ctx, counts = bound
        count = counts.get(name, 0)
        counts[name] = count + 1
        return await ctx.astep(f"{name}:{count}", body, **config)


class DjangoDurability(BaseDurabilityCapability):
    """The capability that makes an agent durable in django-durable's workflows.

    `retry` (a durable.RetryPolicy) and `timeout` (seconds) apply to each model request and tool
    call; by default the workflow's retry policy, as for any step. The other arguments are
    pydantic-ai's (`models` to switch models at run time, `event_stream_handler`, `name`).
    """

    engine_spec = DurabilityEngineSpec(
        engine_name="django-durable",
        durable_unit_noun="step",
        durable_container_noun="workflow",
        codec=JSON_CODEC,
        serialization_failure=_not_json,
        tool_config_key="django_durable",
    )

    def __init__(self, *, retry=None, timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._unit_config = {key: value for key, value in (("retry", retry), ("timeout", timeout)) if value is not None}

    @property
    def in_durable_context(self) -> bool:
        return _bound.get() is not None

    def get_default_run_id(self) -> str | None:
        bound = _bound.get()
        return None if bound is None else str(bound[0].run_id)

    async def get_run_start_time(self, run_id: str) -> datetime | None:
        bound = _bound.get()
        return None if bound is None else bound[0].now()

    def get_durable_operation_backend(self) -> DjangoDurabilityBackend:
        config = self._unit_config
        return DjangoDurabilityBackend(
            agent_name=self.name or "agent",
            config=RoleBasedOperationConfig(model=config, event=config, capability=config, tool=config),
        )


@contextmanager
def agent_run(ctx) -> Iterator[None]:
    """Inside it, an agent with DjangoDurability run on an event loop is a part of the run `ctx`."""
    token = _bound.set((ctx, {}))
    try:
        yield
    finally:
        _bound.reset(token)


def run_agent(ctx, agent, user_prompt=None, **kwargs: Any) -> Any:
    """Run `agent` to its end as a part of the workflow run `ctx` (from a sync workflow); return its
    output, which must be JSON (the workflow's result). `kwargs` go to `agent.run()`."""
    with agent_run(ctx):
        return asyncio.run(agent.run(user_prompt, **kwargs)).output


def stream_text(name: str):
    """An `event_stream_handler` that writes the model's text to the run's stream `name` as it
    comes, from inside the model request's step: a reader of the stream (``durable.read_stream()``,
    ``GET …/stream/``) has the answer token by token. A retried request's abandoned text is marked
    (``durable.AbandonedValues``)."""
    from pydantic_ai.messages import PartDeltaEvent, PartStartEvent, TextPart, TextPartDelta

    from ..engine.composition import get_current_step

    async def handler(run_context, events) -> None:
        step = get_current_step()
        async for event in events:
            if step is None:
                continue  # the run's events outside a model request: its text was written inside it
            text = None
            if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                text = event.part.content
            elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                text = event.delta.content_delta
            if text:
                await step.awrite_stream(name, text)

    return handler
