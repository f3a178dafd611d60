"""What the agent integrations share (django_durable.contrib.pydantic_ai and .openai_agents): how an
agent's run is spelled in the journal, its tools' approvals, what a provider's error means to a
retry, its shape, and reading the run back — the conversation in order and what its model requests
used and cost — without importing either framework (the admin reads any run with it).

An agent's run in the journal:

- a prompt: the note ``run_agent`` writes before the agent's first request;
- a model request: a step ``<agent>__model.request:<n>`` (or ``request_stream``), whose result is
  the model's response (pydantic-ai's JSON: ``parts``; the OpenAI Agents SDK's: ``output`` items),
  with its token usage and the model's name;
- a tool call: a step ``<agent>__….call_tool:<tool>:<n>``, whose result is what the tool returned;
- an approval: the wait ``<agent>__approval:<tool>:<n>``, with its decision;
- a workflow tool's call: the child run ``<agent>__workflow:<tool>:<n>``, whose result is the child's.

The cost of a request is the provider's, when it said (``usage.cost``), else the price of its
tokens at the time of the request by genai-prices (pydantic-ai's), when the model is one it
knows; a request it does not know is counted as unpriced.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ..exceptions import NonRetryableError, RetryAfter

_MODEL = re.compile(r"^(?P<agent>.+?)__model\.request(?:_stream)?:\d+$")
_TOOL = re.compile(r"^(?P<agent>.+?)__.*\.call_tool:(?P<tool>.+):\d+$")
_APPROVAL = re.compile(r"^(?P<agent>.+?)__approval:(?P<tool>.+):\d+$")
_CHILD = re.compile(r"^(?P<agent>.+?)__workflow:(?P<tool>.+):\d+$")  # a workflow tool's child run


def model_key(agent: str, count: int) -> str:
    return f"{agent}__model.request:{count}"


def tool_key(agent: str, tool: str, count: int) -> str:
    return f"{agent}__tool.call_tool:{tool}:{count}"


def approval_key(agent: str, tool: str, count: int) -> str:
    return f"{agent}__approval:{tool}:{count}"


def next_count(counts: dict[str, int], name: str) -> int:
    """The count of `name` in the agent's run so far, counted on: a unit's key is its name and count."""
    count = counts.get(name, 0)
    counts[name] = count + 1
    return count


def describing(ctx) -> bool:
    """Whether `ctx` is describe()'s recorder of shapes: run_agent then records the agent's loop
    as one node (describe_agent) and runs nothing."""
    from ..engine.describe import Recorder

    return isinstance(ctx, Recorder)


def step_config(retry=None, timeout: float | None = None) -> dict:
    """The keyword arguments of ctx.astep() for each unit of an agent's run: those given."""
    return {key: value for key, value in (("retry", retry), ("timeout", timeout)) if value is not None}


def approvers_for(approvers, tool: str):
    """Who may approve a call of `tool`: `approvers`, or its entry for the tool when it is a dict."""
    return approvers.get(tool) if isinstance(approvers, dict) else approvers


async def run_unit(ctx, key: str, module: str, label: str, call, config: dict, answer) -> Any:
    """Run the coroutine function `call` as the step `key` of the run `ctx`, named `module.label`
    in the admin's step list (the framework's, and the unit's name). `answer(exc)` maps an error of the model's provider to what it means to the
    step's retries (retry_answer), or returns None for any other error, which goes as it is."""
    ceiling = config["retry"].max_backoff if "retry" in config else None

    async def unit() -> Any:
        try:
            return await call()
        except Exception as exc:
            mapped = answer(exc, ceiling)
            if mapped is None or mapped is exc:
                raise
            raise mapped from exc

    unit.__module__, unit.__qualname__ = module, label
    return await ctx.astep(key, unit, **config)


def note_prompt(ctx, agent: str, prompt: Any) -> None:
    """Write the prompt to the run's journal (the conversation's first turn), once."""
    if prompt is not None:
        text = prompt if isinstance(prompt, str) else [part if isinstance(part, str) else repr(part) for part in prompt]
        ctx.note(f"{agent}: asked", agent=agent, prompt=text)


def decide_tool(ctx, counts: dict[str, int], agent: str, tool: str, args: dict, call_id: str, *, approvers,
                timeout) -> tuple[bool, str]:
    """Wait for people to decide whether the agent may call `tool` with `args`; return (approved,
    what the model is told when it was not)."""
    approvers = approvers_for(approvers, tool)
    if approvers is None:
        raise NonRetryableError(f"The agent {agent!r} asks to call {tool!r}, which needs approval, and "
                                f"run_agent was given no approvers for it: pass approvers=... (a permission, a "
                                f"group, users, or a dict from tool name to them).")
    shown = ", ".join(f"{name}={value!r}" for name, value in args.items())
    decision = ctx.wait_for_approval(
        approval_key(agent, tool, next_count(counts, f"approval:{tool}")), approvers=approvers, timeout=timeout,
        message=f"The agent {agent} asks to call {tool}({shown if len(shown) <= 500 else shown[:499] + '…'}).",
        data={"agent": agent, "tool": tool, "args": args, "tool_call_id": call_id})
    if decision["approved"]:
        return True, ""
    rejected = [d for d in decision.get("decisions", []) if not d.get("approved")]
    comments = "; ".join(d["comment"] for d in rejected if d.get("comment"))
    who = ", ".join(d["user"] for d in rejected) or "nobody"
    return False, f"The tool call was denied by {who}" + (f": {comments}" if comments else ".")


_TRANSIENT = (408, 409, 425, 429)  # the 4xx statuses a later attempt may pass


def retry_answer(exc: BaseException, *, status: int | None, retry_after: float | None, refused: bool = False,
                 ceiling: float | None = None) -> BaseException:
    """What a model provider's error means to the step's retries: a request the provider refuses
    (`refused`, or a 4xx but a timeout, a conflict or a rate limit) fails at once; one the provider
    asked to wait for (`retry_after` seconds) is tried again after that wait, at most `ceiling`
    (the retry policy's longest back-off, when one is given); anything else goes by the policy."""
    if refused or (status is not None and 400 <= status < 500 and status not in _TRANSIENT):
        return NonRetryableError(f"{type(exc).__name__}: {exc}")
    if retry_after is not None:
        seconds = max(0.0, retry_after if ceiling is None else min(retry_after, ceiling))
        return RetryAfter(seconds, f"{type(exc).__name__}: {exc} (the provider asked to wait {retry_after:g} s)")
    return exc


def describe_agent(recorder, agent: str, model: str | None, tools: list[str], approvals: dict, timeout,
                   children: dict | None = None) -> Any:
    """The agent's loop as one node of a workflow's shape (describe()): its model, its tools, which
    of them wait for approval by whom, and which run a workflow as a child (tool name: workflow)."""
    from ..engine.describe import Unknown

    node = {"type": "agent", "agent": agent, "keys": f"{agent}__*", "tools": tools, "model": model}
    if children:
        node["children"] = [{"name": name, "workflow": workflow} for name, workflow in children.items()]
    recorder.part(node, key=f"{agent}__*", what=f"run_agent() of {agent}", approvals=approvals, timeout=timeout)
    return Unknown(f"output of agent {agent}")


@dataclass
class Turn:
    """One thing said or done in an agent's run, in order."""

    kind: str  # prompt, text, thinking, tool_call, tool_result, approval, pending
    agent: str
    text: str = ""
    tool: str = ""
    args: Any = None
    key: str = ""  # the journal entry it was read from
    status: str = ""  # the entry's status; an approval's "approved" or "rejected"
    at: dt.datetime | None = None


@dataclass
class Usage:
    """What an agent's model requests used: tokens, and the cost where it is known."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal = Decimal(0)  # of the priced requests
    unpriced: int = 0  # requests whose model genai-prices does not know
    models: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict:
        return {"requests": self.requests, "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cost": str(self.cost) if self.requests > self.unpriced else None, "unpriced": self.unpriced,
                "models": self.models}


def usage_of(run) -> Usage | None:
    """What `run`'s agents' model requests used and cost; None when the run ran no agent."""
    from ..models import Step

    requests = Step.objects.using(run._state.db or "default").filter(run=run, key__contains="__model.request")
    return read(requests.order_by("seq"))[1] if requests.exists() else None


def of_run(run, limit: int = 500) -> tuple[list[Turn], Usage, bool] | None:
    """The conversation and usage of `run`'s agents, from its first `limit` agent entries (and
    whether there were more); None when the run ran no agent. What the admin and the API show."""
    from django.db.models import Q

    from ..models import Step

    steps = Step.objects.using(run._state.db or "default").filter(run=run)
    if not steps.filter(key__contains="__model.request").exists():
        return None
    entries = steps.filter(Q(key__contains="__model.request") | Q(key__contains=".call_tool:")
                           | Q(key__contains="__approval:") | Q(key__contains="__workflow:")
                           | Q(kind=Step.Kind.LOG)).order_by("seq")
    fetched = list(entries[:limit + 1])  # one more than shown: whether there were more
    turns, usage = read(fetched[:limit])
    return turns, usage, len(fetched) > limit


def read(steps) -> tuple[list[Turn], Usage]:
    """The conversation and the usage of the agent runs in `steps` (a run's Step rows, in order)."""
    turns: list[Turn] = []
    usage = Usage()
    for step in steps:
        key = step.key
        if step.kind == "log":
            note = _json(step.result) or {}
            data = note.get("data") or {}
            if "agent" in data and "prompt" in data:
                prompt = data["prompt"]
                turns.append(Turn("prompt", data["agent"], prompt if isinstance(prompt, str) else " ".join(map(str, prompt)),
                                  key=key, status=step.status, at=step.started_at))
        elif match := _MODEL.match(key):
            response = _json(step.result) if step.status == "completed" else None
            if response is None:
                turns.append(Turn("pending", match["agent"], key=key, status=step.status, at=step.started_at))
                continue
            _count(usage, response)
            if "output" in response:  # the OpenAI Agents SDK's Responses items
                turns.extend(_items(response["output"], match["agent"], key, step.started_at))
                continue
            for part in response.get("parts", []):
                kind = part.get("part_kind")
                if kind == "text":
                    turns.append(Turn("text", match["agent"], part.get("content", ""), key=key, at=step.started_at))
                elif kind == "thinking":
                    turns.append(Turn("thinking", match["agent"], part.get("content", ""), key=key, at=step.started_at))
                elif kind == "tool-call":
                    turns.append(Turn("tool_call", match["agent"], tool=part.get("tool_name", ""),
                                      args=part.get("args"), key=key, at=step.started_at))
        elif match := _TOOL.match(key) or _CHILD.match(key):
            value = _json(step.result) if step.status == "completed" else None
            if isinstance(value, dict) and value.get("kind") == "call_deferred":
                continue  # the call handed to a workflow tool's child (the next entry) or to people
            returned = value.get("result", value) if isinstance(value, dict) and value.get("kind") == "tool_return" else value
            turns.append(Turn("tool_result", match["agent"], "" if returned is None else _shown(returned),
                              tool=match["tool"], key=key, status=step.status, at=step.started_at))
        elif match := _APPROVAL.match(key):
            decision = _json(step.result) if step.status == "completed" else None
            status = step.status if decision is None else ("approved" if decision.get("approved") else "rejected")
            who = ", ".join(d.get("user", "") for d in (decision or {}).get("decisions", []))
            turns.append(Turn("approval", match["agent"], who, tool=match["tool"], key=key, status=status,
                              at=step.started_at))
    return turns, usage


def _items(items: list, agent: str, key: str, at) -> list[Turn]:
    turns = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            text = "".join(part.get("text", "") or part.get("refusal", "") for part in item.get("content", []))
            turns.append(Turn("text", agent, text, key=key, at=at))
        elif kind == "function_call":
            turns.append(Turn("tool_call", agent, tool=item.get("name", ""), args=_json(item.get("arguments")),
                              key=key, at=at))
        elif kind == "reasoning":
            text = " ".join(part.get("text", "") for part in item.get("summary", []))
            if text:
                turns.append(Turn("thinking", agent, text, key=key, at=at))
    return turns


def _count(usage: Usage, response: dict) -> None:
    tokens = response.get("usage") or {}
    usage.requests += 1
    usage.input_tokens += int(tokens.get("input_tokens") or 0)
    usage.output_tokens += int(tokens.get("output_tokens") or 0)
    model = response.get("model_name") or ""
    if model and model not in usage.models:
        usage.models.append(model)
    cost = _cost(response, tokens, model)
    if cost is None:
        usage.unpriced += 1
    else:
        usage.cost += cost


def _cost(response: dict, tokens: dict, model: str) -> Decimal | None:
    if tokens.get("cost") is not None:  # what the provider (or a gateway) said it charged
        return Decimal(str(tokens["cost"]))
    try:
        from genai_prices import calc_price, types
    except ImportError:
        return None
    try:
        when = dt.datetime.fromisoformat(response["timestamp"]) if response.get("timestamp") else None
        price = calc_price(types.Usage.from_raw(tokens), model, provider_id=response.get("provider_name") or None,
                           genai_request_timestamp=when)
    except (LookupError, ValueError, TypeError):
        return None
    return Decimal(str(price.total_price))


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
