"""OpenAI Agents SDK agents whose every model request and tool call is a step of a durable run.

    from agents import Agent, function_tool
    from django_durable.contrib.openai_agents import run_agent

    @function_tool(needs_approval=True)
    def refund(order_id: int) -> str: ...

    support = Agent(name="support", model="gpt-5", tools=[refund])

    @durable.workflow("support.answer")
    def answer(ctx, question):
        return run_agent(ctx, support, question, approvers="orders.approve_refund", stream="answer")

``run_agent`` runs ``Runner.run`` with a copy of the agent (and of the agents it hands off to)
whose model and function tools are wrapped: each model request is a step
``<agent>__model.request:<n>`` whose result is the model's response as JSON (its output items in
the Responses format, its usage, the model's name), and each function tool call a step
``<agent>__tool.call_tool:<tool>:<n>`` whose result is what the tool returned. A replay returns the
recorded values; a worker that dies mid-agent resumes with its completed requests and tool calls
replayed, and the one in flight run again. A tool with ``needs_approval`` ends the SDK's run with an
interruption; ``run_agent`` waits for it with ``ctx.wait_for_approval()`` and runs on from the
run's state with the decision. With `stream`, each model request streams, and its text goes to the
run's stream of that name from inside the request's step, as it comes.

Not wrapped: hosted tools (web search, file search, code interpreter: they run at the provider,
inside the model request's step), MCP servers' tools, and handoffs given as ``Handoff`` objects
rather than agents.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from typing import Any

from agents import Agent, Model, RunConfig, Runner
from agents.items import ModelResponse, TResponseOutputItem
from agents.models.multi_provider import MultiProvider
from agents.tool import FunctionTool
from agents.usage import Usage
from openai import APIStatusError
from pydantic import TypeAdapter

from ..exceptions import NonRetryableError
from .agent_runs import (
    approvers_for,
    decide_tool,
    describe_agent,
    describing,
    model_key,
    next_count,
    note_prompt,
    retry_answer,
    run_unit,
    step_config,
    tool_key,
)

_OUTPUT = TypeAdapter(list[TResponseOutputItem])


def run_agent(ctx, agent: Agent, input: Any, *, approvers=None, approval_timeout=None, stream: str | None = None,
              retry=None, timeout: float | None = None, run_config: RunConfig | None = None, **kwargs: Any) -> Any:
    """Run `agent` to its end as a part of the workflow run `ctx` (from a sync workflow); return its
    final output, which must be JSON (the workflow's result). `kwargs` go to ``Runner.run()``.

    `approvers` and `approval_timeout`: who may approve a tool with ``needs_approval`` (a
    permission, a group, users, or a dict from tool name to those) and for how long (None: as long
    as it takes). `stream`: the name of the run's stream the model's text is written to as it
    comes. `retry` (a durable.RetryPolicy) and `timeout` (seconds) apply to each model request and
    tool call; by default the workflow's, as for any step.
    """
    if describing(ctx):
        return _describe(ctx, agent, approvers, approval_timeout)
    config = step_config(retry, timeout)
    run_config = run_config or RunConfig()
    counts: dict[str, int] = {}
    wrapper = _Wrapper(ctx, counts, config, stream, run_config)
    durable_agent = wrapper.agent(agent)
    if run_config.model is not None:  # the model of every agent: wrapped in each agent's copy instead
        run_config = dataclasses.replace(run_config, model=None)
    note_prompt(ctx, agent.name, input)
    result = asyncio.run(Runner.run(durable_agent, input, run_config=run_config, **kwargs))
    while result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            raw = item.raw_item
            arguments = getattr(raw, "arguments", None) or "{}"
            approved, denial = decide_tool(
                ctx, counts, item.agent.name, item.tool_name or getattr(raw, "name", "tool"), _arguments(arguments),
                getattr(raw, "call_id", "") or "", approvers=approvers, timeout=approval_timeout)
            if approved:
                state.approve(item)
            else:
                state.reject(item, rejection_message=denial)
        result = asyncio.run(Runner.run(durable_agent, state, run_config=run_config, **kwargs))
    return result.final_output


class _Wrapper:
    """Copies of an agent and of the agents it hands off to, with their models and function tools
    made steps of the run `ctx`."""

    def __init__(self, ctx, counts: dict[str, int], config: dict, stream: str | None, run_config: RunConfig):
        self.ctx, self.counts, self.config, self.stream, self.run_config = ctx, counts, config, stream, run_config
        self.made: dict[int, Agent] = {}

    def agent(self, agent: Agent) -> Agent:
        made = self.made.get(id(agent))
        if made is not None:
            return made
        chosen = self.run_config.model if self.run_config.model is not None else agent.model
        model = chosen if isinstance(chosen, Model) else (self.run_config.model_provider or MultiProvider()).get_model(chosen)
        name = chosen if isinstance(chosen, str) else getattr(model, "model", None)
        made = self.made[id(agent)] = agent.clone(
            model=_StepModel(self, agent.name, model, str(name) if name else None),
            tools=[self.tool(agent.name, tool) for tool in agent.tools])
        made.handoffs = [self.agent(handoff) if isinstance(handoff, Agent) else handoff
                         for handoff in agent.handoffs]
        return made

    def tool(self, agent: str, tool):
        if not isinstance(tool, FunctionTool):
            return tool
        invoke = tool.on_invoke_tool

        async def on_invoke_tool(tool_context, arguments: str) -> Any:
            return await self.step(tool_key(agent, tool.name, next_count(self.counts, f"{agent}:{tool.name}")),
                                   lambda: invoke(tool_context, arguments))

        made = copy.copy(tool)
        made.on_invoke_tool = on_invoke_tool
        return made

    async def step(self, key: str, call) -> Any:
        """Run the coroutine function `call` as the step `key`, a provider's error answered for its retries."""
        return await run_unit(self.ctx, key, "agents", key.rpartition(":")[0], call, self.config, _provider_error)


def _provider_error(exc: BaseException, ceiling: float | None) -> BaseException | None:
    """The openai client's status error as the step's retries should see it (agent_runs.retry_answer)."""
    if not isinstance(exc, APIStatusError):
        return None
    return retry_answer(exc, status=exc.status_code, retry_after=_retry_after(exc), ceiling=ceiling)


class _StepModel(Model):
    """A model whose every request is a step of the run: the response recorded as JSON."""

    def __init__(self, wrapper: _Wrapper, agent: str, model: Model, name: str | None):
        self.wrapper, self.agent, self.model, self.name = wrapper, agent, model, name

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        wrapper = self.wrapper
        key = model_key(self.agent, next_count(wrapper.counts, f"{self.agent}:model"))

        async def request() -> dict:
            response = await (self._streamed(args, kwargs) if wrapper.stream else self.model.get_response(*args, **kwargs))
            return _recorded(response, self.name)

        return _response(await wrapper.step(key, request))

    async def _streamed(self, args, kwargs) -> ModelResponse:
        from ..engine.composition import get_current_step

        step, response = get_current_step(), None
        async for event in self.model.stream_response(*args, **kwargs):
            if event.type == "response.output_text.delta" and event.delta and step is not None:
                await step.awrite_stream(self.wrapper.stream, event.delta)
            elif event.type == "response.completed":
                response = event.response
        if response is None:
            raise RuntimeError(f"The model's stream for the agent {self.agent!r} ended without its response.")
        usage = response.usage
        return ModelResponse(output=list(response.output), response_id=response.id, usage=Usage(
            requests=1, input_tokens=usage.input_tokens if usage else 0,
            output_tokens=usage.output_tokens if usage else 0, total_tokens=usage.total_tokens if usage else 0))

    def stream_response(self, *args: Any, **kwargs: Any):
        raise NonRetryableError("run_agent runs the agent with Runner.run; pass stream=<name> to have the model's "
                                "text written to the run's stream as it comes.")


def _recorded(response: ModelResponse, name: str | None) -> dict:
    usage = response.usage
    return {"output": [item.model_dump(mode="json", exclude_none=True) for item in response.output],
            "usage": {"requests": usage.requests, "input_tokens": usage.input_tokens,
                      "output_tokens": usage.output_tokens, "total_tokens": usage.total_tokens},
            "response_id": response.response_id, "model_name": name}


def _response(recorded: dict) -> ModelResponse:
    usage = recorded.get("usage") or {}
    return ModelResponse(output=_OUTPUT.validate_python(recorded["output"]), response_id=recorded.get("response_id"),
                         usage=Usage(requests=usage.get("requests", 1), input_tokens=usage.get("input_tokens", 0),
                                     output_tokens=usage.get("output_tokens", 0),
                                     total_tokens=usage.get("total_tokens", 0)))


def _retry_after(exc: APIStatusError) -> float | None:
    headers = getattr(exc.response, "headers", None) or {}
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        try:
            return float(headers[name]) * scale
        except (KeyError, ValueError, TypeError):
            continue
    return None


def _arguments(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {"arguments": text}
    return value if isinstance(value, dict) else {"arguments": value}


def _describe(recorder, agent: Agent, approvers, approval_timeout):
    tools, approvals = [], {}
    for tool in agent.tools:
        name = getattr(tool, "name", type(tool).__name__)
        tools.append(name)
        if getattr(tool, "needs_approval", False):
            approvals[name] = approvers_for(approvers, name)
    model = agent.model if isinstance(agent.model, str) or agent.model is None else \
        getattr(agent.model, "model", type(agent.model).__name__)
    return describe_agent(recorder, agent.name, model, tools, approvals, approval_timeout)

