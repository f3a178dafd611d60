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

A tool that needs approval (pydantic-ai's deferred tools, ``requires_approval=True``) ends the
agent's run with its requests; ``run_agent`` waits for each with ``ctx.wait_for_approval()``
(gated by the approvers given, for as long as it takes) and runs the agent on from its messages
with the decisions. A model request refused for a rate limit is tried again when the provider
said (``Retry-After``); one the provider will refuse again (a rejected request, no quota) fails at
once. What the run's model requests used and cost is read from the journal
(``django_durable.contrib.agent_runs``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from pydantic_ai.durable_exec._base import BaseDurabilityCapability
from pydantic_ai.durable_exec._codec import JSON_CODEC
from pydantic_ai.durable_exec._operation import DurableOperationId
from pydantic_ai.durable_exec._operation_backend import JournalCallableOperationBackend, RoleBasedOperationConfig
from pydantic_ai.durable_exec._spec import DurabilityEngineSpec
from pydantic import create_model
from pydantic_ai.exceptions import (
    CallDeferred,
    ModelAPIError,
    ModelHTTPError,
    ModelQuotaExceededError,
    ModelRequestRejectedError,
    ToolFailed,
)
from pydantic_ai.tools import DeferredToolRequests, DeferredToolResults, Tool, ToolDenied

from .. import registry
from ..exceptions import ChildFailed, NonRetryableError
from .agent_runs import (
    approvers_for,
    decide_tool,
    describe_agent,
    describing,
    next_count,
    note_prompt,
    retry_answer,
    run_unit,
    step_config,
)

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
        return await run_unit(ctx, f"{name}:{next_count(counts, name)}", "pydantic_ai", name, body, config,
                              _provider_error)


def _provider_error(exc: BaseException, ceiling: float | None) -> BaseException | None:
    """A model provider's error as the step's retries should see it (agent_runs.retry_answer)."""
    if not isinstance(exc, ModelAPIError):
        return None
    return retry_answer(exc, status=exc.status_code if isinstance(exc, ModelHTTPError) else None,
                        retry_after=exc.retry_after,
                        refused=isinstance(exc, ModelRequestRejectedError | ModelQuotaExceededError), ceiling=ceiling)


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
        self._unit_config = step_config(retry, timeout)

    @property
    def in_durable_context(self) -> bool:
        return _bound.get() is not None

    def get_default_run_id(self) -> str | None:
        # One per agent.run() of the workflow run: run_agent runs the agent again after approvals,
        # with the earlier messages, and pydantic-ai wants each of its runs told apart.
        bound = _bound.get()
        if bound is None:
            return None
        ctx, counts = bound
        count = counts.get("run", 0)
        return str(ctx.run_id) if count <= 1 else f"{ctx.run_id}:{count}"

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
def agent_run(ctx) -> Iterator[dict[str, int]]:
    """Inside it, an agent with DjangoDurability run on an event loop is a part of the run `ctx`."""
    counts: dict[str, int] = {}
    token = _bound.set((ctx, counts))
    try:
        yield counts
    finally:
        _bound.reset(token)


def run_agent(ctx, agent, user_prompt=None, *, approvers=None, approval_timeout=None, **kwargs: Any) -> Any:
    """Run `agent` to its end as a part of the workflow run `ctx` (from a sync workflow); return its
    output, which must be JSON (the workflow's result). `kwargs` go to `agent.run()`.

    A tool the agent marks ``requires_approval=True`` waits for people: `approvers` says who may
    decide (as for ``ctx.wait_for_approval()``: a permission, a group, users; or a dict from tool
    name to that), `approval_timeout` how long to wait (None: as long as it takes; then
    ApprovalTimeout). An approved call runs as a step; a rejected one tells the model it was
    denied, with the approver's comment.
    """
    if describing(ctx):
        return _describe(ctx, agent, approvers, approval_timeout)
    deferred = _deferred_output(agent, kwargs.pop("output_type", None)) if _defers(agent) else None
    if deferred is not None:
        kwargs["output_type"] = deferred
    note_prompt(ctx, agent.name, user_prompt)
    with agent_run(ctx) as counts:
        counts["run"] = 1
        result = asyncio.run(agent.run(user_prompt, **kwargs))
        while isinstance(result.output, DeferredToolRequests):
            requests = result.output
            decisions: dict[str, Any] = {}
            for call in requests.approvals:
                approved, denial = decide_tool(ctx, counts, agent.name, call.tool_name, call.args_as_dict(),
                                               call.tool_call_id, approvers=approvers, timeout=approval_timeout)
                decisions[call.tool_call_id] = True if approved else ToolDenied(denial)
            started = [(call, _child(ctx, counts, agent, call, requests.metadata.get(call.tool_call_id)))
                       for call in requests.calls]  # every child at once, then their results
            returned = {call.tool_call_id: _returned(child, workflow) for call, (child, workflow) in started}
            counts["run"] += 1
            result = asyncio.run(agent.run(
                message_history=result.all_messages(),
                deferred_tool_results=DeferredToolResults(approvals=decisions, calls=returned), **kwargs))
    return result.output


def workflow_tool(workflow, *, name: str | None = None, description: str | None = None) -> Tool:
    """A tool that runs the registered workflow `workflow` (its name or its function) as a child
    run of the agent's run, with the arguments the model gives it (the workflow's parameters after
    its context, as its annotations say), and returns the child's result to the model.

    The agent's run stops at the call; ``run_agent`` starts the child with ``ctx.child()`` (the
    worker holds nothing while it runs, for as long as it takes, and a replay never starts it
    twice), then runs the agent on with its result. A child that does not complete is reported to
    the model as the tool's failure. `name` defaults to the last part of the workflow's name,
    `description` to its docstring.
    """
    definition = registry.get(workflow)
    code = getattr(definition.fn, "__wrapped__", definition.fn)

    def deferred(**arguments: Any) -> Any:
        raise CallDeferred(metadata={_WORKFLOW: definition.name})

    setattr(deferred, _WORKFLOW, definition.name)
    return Tool.from_schema(deferred, name=name or definition.name.rpartition(".")[2],
                            description=description or inspect.getdoc(code) or f"Run the workflow {definition.name}.",
                            json_schema=_parameters_schema(code, definition.name))


_WORKFLOW = "django_durable_workflow"  # a deferred call's metadata: the workflow it runs


def _parameters_schema(fn, name: str) -> dict:
    """The JSON schema of a workflow's parameters after its context, from their annotations."""
    fields: dict[str, Any] = {}
    for parameter in list(inspect.signature(fn).parameters.values())[1:]:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = Any if parameter.annotation is parameter.empty else parameter.annotation
        fields[parameter.name] = (annotation, ... if parameter.default is parameter.empty else parameter.default)
    return create_model(f"{name.replace('.', '_')}_arguments", **fields).model_json_schema()


def _child(ctx, counts: dict[str, int], agent, call, metadata: dict | None) -> tuple[Any, str]:
    """Start the workflow a workflow tool's call stands for as a child of `ctx`'s run: its handle
    and the workflow's name."""
    workflow = (metadata or {}).get(_WORKFLOW)
    if workflow is None:
        raise NonRetryableError(f"The agent {agent.name!r} deferred the call of {call.tool_name!r} to be run "
                                f"outside it; run_agent runs workflow tools (workflow_tool()) and waits for "
                                f"approvals only: make the tool a workflow_tool, or a plain tool (a step).")
    key = f"{agent.name}__workflow:{call.tool_name}:{next_count(counts, f'workflow:{call.tool_name}')}"
    return ctx.start_child(key, workflow, **call.args_as_dict()), workflow


def _returned(child, workflow: str) -> Any:
    """The child's result for the model, or the tool's failure when it did not complete."""
    try:
        return child.result()
    except ChildFailed as failed:
        return ToolFailed(f"The workflow {workflow} ended {failed.status}: {failed.message}")


def _tools(agent) -> dict:
    return {name: tool for toolset in agent.toolsets for name, tool in getattr(toolset, "tools", {}).items()}


def _workflow_of(tool) -> str | None:
    return getattr(getattr(tool, "function", None), _WORKFLOW, None)


def _defers(agent) -> bool:
    """Whether a tool of `agent` ends its run to be decided or run outside it (an approval, a workflow)."""
    return any(getattr(tool, "requires_approval", False) or _workflow_of(tool) for tool in _tools(agent).values())


def _deferred_output(agent, output_type):
    """The output type to run with: the agent's (or the one given), with DeferredToolRequests added."""
    output_type = output_type if output_type is not None else agent.output_type
    types = list(output_type) if isinstance(output_type, list | tuple) else [output_type]
    return types if DeferredToolRequests in types else [*types, DeferredToolRequests]


def _describe(recorder, agent, approvers, approval_timeout):
    """The agent's loop in a workflow's shape: its model, its tools, which wait for approval and by
    whom, which run a workflow as a child."""
    tools, approvals, children = [], {}, {}
    for tool_name, tool in _tools(agent).items():
        tools.append(tool_name)
        if getattr(tool, "requires_approval", False):
            approvals[tool_name] = approvers_for(approvers, tool_name)
        if _workflow_of(tool):
            children[tool_name] = _workflow_of(tool)
    model = agent.model
    return describe_agent(recorder, agent.name or "agent", model if isinstance(model, str) or model is None
                          else f"{model.system}:{model.model_name}", tools, approvals, approval_timeout, children)


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
