"""The OpenAI Agents SDK's refund desk (tests/test_agent_integrations.py, tests/test_openai_agents.py):
imported by those tests, and by a worker's workflows.py only when DURABLE_TEST_AGENTS=openai. Its
model answers from the request's input (no network, no key): look the order up, ask to refund it,
then say what the tools returned."""


from agents import Agent, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

import django_durable as durable
from django_durable.contrib.openai_agents import run_agent

from . import ledger
from .workflows import hold_once

set_tracing_disabled(True)  # the SDK would send its traces to OpenAI


class DeskModel(Model):
    """Calls look_up, then refund, then answers with what they returned, a word at a time when
    streamed. Its name is a model genai-prices knows, so the run's cost is priced."""

    model = "gpt-4o"

    def __init__(self, look_up: str = "look_up"):
        self.look_up = look_up  # the name of the tool that reads the order

    def _output(self, input) -> list:
        ledger.record("openai-agent", "model")
        returned = {item["call_id"]: item["output"] for item in input
                    if isinstance(item, dict) and item.get("type") == "function_call_output"}
        if "look" not in returned:
            return [ResponseFunctionToolCall(type="function_call", name=self.look_up, arguments='{"order_id": 7}',
                                             call_id="look", id="fc-look", status="completed")]
        if "refund" not in returned:
            return [ResponseFunctionToolCall(type="function_call", name="refund", arguments='{"order_id": 7}',
                                             call_id="refund", id="fc-refund", status="completed")]
        hold_once()
        text = f"Order: {returned['look']}. Refund: {returned['refund']}."
        return [ResponseOutputMessage(type="message", id="msg", role="assistant", status="completed",
                                      content=[ResponseOutputText(type="output_text", text=text, annotations=[])])]

    async def get_response(self, system_instructions, input, *args, **kwargs):
        return ModelResponse(output=self._output(input), response_id="resp",
                             usage=Usage(requests=1, input_tokens=100, output_tokens=20, total_tokens=120))

    async def stream_response(self, system_instructions, input, *args, **kwargs):
        output = self._output(input)
        text = output[0].content[0].text if output[0].type == "message" else ""
        for number, word in enumerate(text.split(" ") if text else []):
            yield ResponseTextDeltaEvent(type="response.output_text.delta", delta=word + " ", item_id="msg",
                                         output_index=0, content_index=0, sequence_number=number, logprobs=[])
        usage = ResponseUsage(input_tokens=100, output_tokens=20, total_tokens=120,
                              input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
                              output_tokens_details=OutputTokensDetails(reasoning_tokens=0))
        yield ResponseCompletedEvent(type="response.completed", sequence_number=99, response=Response(
            id="resp", created_at=0, model="gpt-4o", object="response", output=output, parallel_tool_calls=True,
            tool_choice="auto", tools=[], usage=usage))


@function_tool
def look_up(order_id: int) -> str:
    """The order's status."""
    ledger.record("openai-agent", "look_up")
    return f"order {order_id} shipped"


@function_tool(needs_approval=True)
def refund(order_id: int) -> str:
    """Refund the order: runs once someone with testapp.approve_refund approved it."""
    ledger.record("openai-agent", "refund")
    return f"refunded order {order_id}"


desk = Agent(name="desk", model=DeskModel(), tools=[look_up, refund])


@durable.workflow("tests.openai_desk")
def openai_desk(ctx, question="refund order 7", stream=None):
    return run_agent(ctx, desk, question, approvers="testapp.approve_refund", stream=stream)
