"""The pydantic-ai agents' workflows (tests/test_pydantic_ai.py, tests/test_agent_integrations.py):
imported by those tests, and by a worker's workflows.py only when DURABLE_TEST_AGENTS is set
(pydantic-ai takes ~2 s to import)."""


from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

import django_durable as durable
from django_durable.contrib.pydantic_ai import DjangoDurability, run_agent, workflow_tool

from . import ledger
from .workflows import hold_once, mark


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
    hold_once()
    return f"order {order_id} shipped"


@durable.workflow("tests.support_agent")
def support_agent(ctx, question):
    answer = run_agent(ctx, support, question)
    ctx.step("after", mark, ctx.run_id, "after")
    return answer


def _desk_model(messages, info):
    """The refund desk (as tests/testapp/openai_agents.py's, for the other integration): looks
    order 7 up, asks to refund it (a tool that needs approval), then says what the tools returned
    (a denial included), held there once with DURABLE_TEST_AGENT_HOLD. Its name is a model
    genai-prices knows, so the run's cost is priced."""
    ledger.record("pydantic-desk", "model")
    returned = {part.tool_name: part.content for message in messages for part in getattr(message, "parts", [])
                if part.part_kind in ("tool-return", "retry-prompt")}
    for tool, call_id in (("look_up", "look"), ("refund", "refund")):
        if tool not in returned:
            return ModelResponse(parts=[ToolCallPart(tool_name=tool, args={"order_id": 7}, tool_call_id=call_id)])
    hold_once()
    return ModelResponse(parts=[TextPart(content=f"Order: {returned['look_up']}. Refund: {returned['refund']}.")])


refunder = Agent(FunctionModel(_desk_model, model_name="gpt-4o"), name="refunder", capabilities=[DjangoDurability()])


@refunder.tool_plain(name="look_up")
def look_up_order(order_id: int) -> str:
    ledger.record("pydantic-desk", "look_up")
    return f"order {order_id} shipped"


@refunder.tool_plain(requires_approval=True)
def refund(order_id: int) -> str:
    """Runs only once someone with testapp.approve_refund approved the call."""
    ledger.record("pydantic-desk", "refund")
    return f"refunded order {order_id}"


@durable.workflow("tests.refund_agent")
def refund_agent(ctx, question="refund order 7"):
    return run_agent(ctx, refunder, question, approvers="testapp.approve_refund")


def ship(order_id):
    ledger.record("pydantic-dispatch", "ship")
    if order_id == 13:
        raise durable.NonRetryableError("no stock for order 13")
    return f"replacement for order {order_id} shipped"


@durable.workflow("tests.ship_replacement")
def ship_replacement(ctx, order_id: int) -> str:
    """Ship a replacement for a damaged order."""
    return ctx.step("ship", ship, order_id)


def _dispatch_model(messages, info):
    """Runs the workflow tool for each order in the prompt, then says what they returned (or how they failed)."""
    asked = next(part.content for message in messages for part in getattr(message, "parts", [])
                 if part.part_kind == "user-prompt")
    returned = [part.content for message in messages for part in getattr(message, "parts", [])
                if part.part_kind in ("tool-return", "retry-prompt")]
    if not returned:  # "replace order 7" or "replace orders 7 8": one call per order, in one response
        return ModelResponse(parts=[ToolCallPart(tool_name="ship_replacement", args={"order_id": int(order_id)},
                                                 tool_call_id=f"ship-{order_id}")
                                    for order_id in asked.split(" ")[2:]])
    return ModelResponse(parts=[TextPart(content="Done: " + "; ".join(returned))])


dispatcher = Agent(FunctionModel(_dispatch_model), name="dispatcher", capabilities=[DjangoDurability()],
                   tools=[workflow_tool("tests.ship_replacement")])


@durable.workflow("tests.dispatch_agent")
def dispatch_agent(ctx, question="replace order 7"):
    return run_agent(ctx, dispatcher, question)
