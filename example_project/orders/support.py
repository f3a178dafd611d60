"""The shop's support agent: a pydantic-ai agent run as a durable workflow.

Each model request and tool call is a step: a worker killed mid-answer resumes without asking the
model again or calling a tool twice. The model's text streams to the run's stream "answer" as it
comes, which the ticket's page follows token by token. `look_up_order` reads the order; `refund_order`
waits for someone with the permission orders.approve_refund.

The demo runs offline: without SUPPORT_MODEL (any pydantic-ai model name, such as
"openai:gpt-5" with OPENAI_API_KEY set) the agent's model is a scripted stand-in that streams its
answer a word at a time, SUPPORT_WORD_SECONDS apart (0.15 by default), so the page has something to
follow. With SUPPORT_HOLD set (the shop's browser test), the stand-in stops half-way through its
answer until that file exists.
"""

import asyncio
import functools
import os
import re

import django_durable as durable

from .models import Order


def _returned(messages) -> dict[str, str]:
    """What each tool returned so far, by the tool's name (a denied call returns its denial)."""
    return {part.tool_name: str(part.content) for message in messages for part in getattr(message, "parts", [])
            if part.part_kind in ("tool-return", "retry-prompt") and getattr(part, "tool_name", None)}


async def _scripted(messages, info):
    """The demo's model: looks the order up, asks for a refund when the customer asked for one,
    then answers from what the tools returned, a word at a time."""
    asked = next(part.content for message in messages for part in getattr(message, "parts", [])
                 if part.part_kind == "user-prompt")
    order_id = int(re.search(r"order (\d+)", asked)[1])
    returned = _returned(messages)
    if "look_up_order" not in returned:
        yield {0: _tool_call(name="look_up_order", json_args=f'{{"order_id": {order_id}}}', tool_call_id="look")}
        return
    wants_refund = "refund" in asked.lower()
    if wants_refund and "refund_order" not in returned:
        yield {0: _tool_call(name="refund_order", json_args=f'{{"order_id": {order_id}}}', tool_call_id="refund")}
        return
    answer = f"Thank you for writing. I looked at your order: {returned['look_up_order']}."
    if wants_refund:
        answer += f" About the refund: {returned['refund_order']}."
    answer += " Is there anything else I can do for you?"
    pause = float(os.environ.get("SUPPORT_WORD_SECONDS", "0.15"))
    words = answer.split(" ")
    for number, word in enumerate(words):
        if number == len(words) // 2:
            await _held()
        await asyncio.sleep(pause)
        yield word + " "


async def _held() -> None:
    hold = os.environ.get("SUPPORT_HOLD")
    for _ in range(6000):  # at most ten minutes
        if not hold or os.path.exists(hold):
            return
        await asyncio.sleep(0.1)


def _tool_call(**call):
    from pydantic_ai.models.function import DeltaToolCall

    return DeltaToolCall(**call)


@functools.cache
def agent():
    """The agent, made when it first runs: pydantic-ai takes about 2 s to import, which every
    manage.py command of the project (migrate, runserver, the workers) would pay at start-up."""
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from django_durable.contrib.pydantic_ai import DjangoDurability, stream_text

    support_agent = Agent(
        os.environ.get("SUPPORT_MODEL") or FunctionModel(stream_function=_scripted, model_name="scripted-support"),
        name="support",
        instructions="You are the support desk of a small shop. Look the order up before you answer. "
                     "Refund an order only when the customer asks for it.",
        capabilities=[DjangoDurability(event_stream_handler=stream_text("answer"))],
    )
    support_agent.tool_plain(look_up_order)
    support_agent.tool_plain(requires_approval=True)(refund_order)
    return support_agent


def look_up_order(order_id: int) -> str:
    """The order's contents and status."""
    order = Order.objects.get(pk=order_id)
    return f"order {order.pk}, {order.quantity} x {order.product} for {order.total}, {order.status}"


def refund_order(order_id: int) -> str:
    """Refund a shipped order in full. Waits for someone allowed to approve refunds."""
    updated = Order.objects.filter(pk=order_id, status="shipped").update(status="refunded")
    return "refunded in full" if updated else "not refunded: only a shipped order can be"


@durable.workflow("orders.support")
def support(ctx: durable.Context, order_id: int, question: str) -> str:
    """Answer a customer's question about an order, with the order's data and, if asked, a refund."""
    from django_durable.contrib.pydantic_ai import run_agent

    return run_agent(ctx, agent(), f"About order {order_id}: {question}",
                     approvers={"refund_order": "orders.approve_refund"})
