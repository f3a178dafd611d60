"""The pydantic-ai agent's workflow of tests/test_pydantic_ai.py: imported by that test, and by a
worker's workflows.py only when DURABLE_TEST_AGENTS is set (pydantic-ai takes ~2 s to import)."""

import os

from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

import django_durable as durable
from django_durable.contrib.pydantic_ai import DjangoDurability, run_agent

from . import ledger
from .workflows import mark, wait_for_file


def _support_model(messages, info):
    """Asks for the order once, then answers with what the tool returned; each request in the ledger."""
    ledger.record("agent", "model")
    returned = [part for message in messages for part in getattr(message, "parts", [])
                if part.part_kind == "tool-return"]
    if not returned:
        return ModelResponse(parts=[ToolCallPart(tool_name="look_up", args={"order_id": 7}, tool_call_id="call-1")])
    return ModelResponse(parts=[TextPart(content=f"Your order: {returned[0].content}")])


support = Agent(FunctionModel(_support_model), name="support", capabilities=[DjangoDurability()])


@support.tool_plain
def look_up(order_id: int) -> str:
    """With DURABLE_TEST_AGENT_HOLD, its first call touches <hold>.held and waits for <hold>.go."""
    ledger.record("agent", "tool")
    _hold_once()
    return f"order {order_id} shipped"


@durable.workflow("tests.support_agent")
def support_agent(ctx, question):
    answer = run_agent(ctx, support, question)
    ctx.step("after", mark, ctx.run_id, "after")
    return answer


def _refund_model(messages, info):
    """Asks to refund order 7, then answers with what the refund tool returned (or its denial),
    held there once with DURABLE_TEST_AGENT_HOLD; its name is a model genai-prices knows, so the
    run's cost is priced."""
    ledger.record("refund-agent", "model")
    returned = [part for message in messages for part in getattr(message, "parts", [])
                if part.part_kind in ("tool-return", "retry-prompt")]
    if not returned:
        return ModelResponse(parts=[ToolCallPart(tool_name="refund", args={"order_id": 7, "amount": 30},
                                                 tool_call_id="call-r")])
    _hold_once()
    return ModelResponse(parts=[TextPart(content=f"Done: {returned[0].content}")])


def _hold_once():
    """With DURABLE_TEST_AGENT_HOLD, the first call touches <hold>.held and waits for <hold>.go."""
    hold = os.environ.get("DURABLE_TEST_AGENT_HOLD")
    if hold and not os.path.exists(hold + ".held"):
        with open(hold + ".held", "w"):
            pass
        wait_for_file(hold + ".go")


refunder = Agent(FunctionModel(_refund_model, model_name="gpt-4o"), name="refunder",
                 capabilities=[DjangoDurability()])


@refunder.tool_plain(requires_approval=True)
def refund(order_id: int, amount: int) -> str:
    """Runs only once someone with testapp.approve_refund approved the call."""
    ledger.record("refund-agent", "refund")
    return f"refunded {amount} on order {order_id}"


@durable.workflow("tests.refund_agent")
def refund_agent(ctx, question="refund my order"):
    return run_agent(ctx, refunder, question, approvers="testapp.approve_refund")
