"""An agent's run read from its journal: the conversation in order, and what its model requests
used and cost. Reads the steps django_durable.contrib.pydantic_ai records, without importing
pydantic-ai (the admin reads any run with it).

- a prompt: the note ``run_agent`` writes before the agent's first request;
- a model request: a step ``<agent>__model.request:<n>`` (or ``request_stream``), whose result is
  the model's response (pydantic-ai's JSON: its parts, its token usage, the model's name);
- a tool call: a step ``<agent>__….call_tool:<tool>:<n>``, whose result is what the tool returned;
- an approval: the wait ``<agent>__approval:<tool>:<n>``, with its decision.

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

_MODEL = re.compile(r"^(?P<agent>.+?)__model\.request(?:_stream)?:\d+$")
_TOOL = re.compile(r"^(?P<agent>.+?)__.*\.call_tool:(?P<tool>.+):\d+$")
_APPROVAL = re.compile(r"^(?P<agent>.+?)__approval:(?P<tool>.+):\d+$")


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


def is_agent_run(steps) -> bool:
    """Whether any of `steps` (the run's journal entries) is an agent's model request."""
    return any(_MODEL.match(step.key) for step in steps)


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
            for part in response.get("parts", []):
                kind = part.get("part_kind")
                if kind == "text":
                    turns.append(Turn("text", match["agent"], part.get("content", ""), key=key, at=step.started_at))
                elif kind == "thinking":
                    turns.append(Turn("thinking", match["agent"], part.get("content", ""), key=key, at=step.started_at))
                elif kind == "tool-call":
                    turns.append(Turn("tool_call", match["agent"], tool=part.get("tool_name", ""),
                                      args=part.get("args"), key=key, at=step.started_at))
        elif match := _TOOL.match(key):
            value = _json(step.result) if step.status == "completed" else None
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
