"""pydantic-ai agents as durable runs (django_durable.contrib.pydantic_ai): each model request and
tool call a step, replayed and never repeated once recorded; the model's text streamed live."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.function import FunctionModel  # noqa: E402

import django_durable as durable  # noqa: E402
from django_durable.contrib.pydantic_ai import DjangoDurability, run_agent, stream_text  # noqa: E402
from django_durable.models import Step, WorkflowRun  # noqa: E402
from django_durable.replaycheck import check_run  # noqa: E402
from django_durable.testing import drain  # noqa: E402
from tests.harness.workers import ON_POSTGRES, wait_for  # noqa: E402
from tests.testapp import agents, ledger  # noqa: E402,F401 - agents registers tests.support_agent

pytestmark = pytest.mark.django_db(transaction=True)  # the steps write on threads of their own


def test_each_model_request_and_tool_call_is_a_step():
    run = durable.start("tests.support_agent", "where is my order?")
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "completed", finished.error
    assert finished.get_result() == "Your order: order 7 shipped"
    keys = list(Step.objects.filter(run=run).order_by("seq").values_list("key", flat=True))
    assert keys == ["note:0", "support__model.request:0", "support__function_toolset__<agent>.call_tool:look_up:0",
                    "support__model.request:1", "after"]
    assert ledger.counts("agent") == {"model": 2, "tool": 1}


def test_a_replay_of_the_agent_makes_no_request_and_calls_no_tool():
    run = durable.start("tests.support_agent", "where is my order?")
    drain()
    verdict = check_run(WorkflowRun.objects.get(pk=run.pk))
    assert verdict.ok, verdict
    assert ledger.counts("agent") == {"model": 2, "tool": 1}  # the replay took every result from the journal


def test_an_async_tool_runs_on_the_agents_own_loop():
    loops = []

    async def where(ctx_loop: str) -> str:
        loops.append(asyncio.get_running_loop())
        return "here"

    def model(messages, info):
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart

        if any(part.part_kind == "tool-return" for message in messages for part in getattr(message, "parts", [])):
            return ModelResponse(parts=[TextPart(content="done")])
        return ModelResponse(parts=[ToolCallPart(tool_name="where", args={"ctx_loop": "?"}, tool_call_id="c1")])

    agent = Agent(FunctionModel(model), name="looped", tools=[where], capabilities=[DjangoDurability()])
    seen = []

    @durable.workflow("tests.agent_on_its_loop")
    def on_its_loop(ctx):
        from django_durable.contrib.pydantic_ai import agent_run

        async def go():
            seen.append(asyncio.get_running_loop())
            return (await agent.run("where?")).output

        with agent_run(ctx):
            return asyncio.run(go())

    run = durable.start("tests.agent_on_its_loop")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    assert loops and loops[0] is seen[0]


def test_the_models_text_streams_to_the_runs_stream():
    async def chunks(messages, info):
        for piece in ["Durable ", "agents ", "resume."]:
            yield piece

    agent = Agent(FunctionModel(stream_function=chunks), name="streaming",
                  capabilities=[DjangoDurability(event_stream_handler=stream_text("answer"))])

    @durable.workflow("tests.streaming_agent")
    def streaming_agent(ctx, question):
        return run_agent(ctx, agent, question)

    run = durable.start("tests.streaming_agent", "why?")
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "completed", finished.error
    assert finished.get_result() == "Durable agents resume."
    assert list(durable.read_stream(run.pk, "answer")) == ["Durable ", "agents ", "resume."]
    entries = Step.objects.filter(run=run, kind="stream").values_list("result", flat=True)
    assert all('"step":"streaming__model.request_stream:0"' in text for text in entries), list(entries)


def test_outside_a_workflow_the_agent_runs_as_a_plain_agent():
    from pydantic_ai.messages import ModelResponse, TextPart

    agent = Agent(FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart(content="hi")])), name="plain",
                  capabilities=[DjangoDurability()])
    assert asyncio.run(agent.run("hello?")).output == "hi"  # in a shell or a test: no run, no steps
    assert not Step.objects.exists()


@pytest.mark.processes
@pytest.mark.timeout(360)
@pytest.mark.skipif(not ON_POSTGRES, reason="an agent's replay does not depend on the database: killed once, on PostgreSQL")
def test_a_worker_killed_in_a_tool_call_makes_no_completed_request_again(start_worker, tmp_path):
    """RELIABILITY T52: SIGKILL while the agent's tool runs; the next worker replays the first
    model request from the journal, runs the tool call that was in flight again, then the rest."""
    hold = str(tmp_path / "hold")
    run = durable.start("tests.support_agent", "where is my order?")
    first = start_worker(burst=False, env={"DURABLE_TEST_AGENT_HOLD": hold, "DURABLE_TEST_AGENTS": "1"})
    wait_for(lambda: (tmp_path / "hold.held").exists(), timeout=150, message="the tool call to start")
    first.kill()
    second = start_worker(env={"DURABLE_TEST_AGENT_HOLD": hold, "DURABLE_TEST_AGENTS": "1"})
    assert second.wait(150) == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == "Your order: order 7 shipped"
    assert ledger.counts("agent") == {"model": 2, "tool": 2}  # the request once; the tool in flight twice
    assert ledger.counts(run.pk) == {"after": 1}


def _failing_agent(name, error):
    """A workflow `tests.<name>` running an agent whose first model request raises `error`, and
    the attempts its model saw (the second answers)."""
    calls = []

    def model(messages, info):
        from pydantic_ai.messages import ModelResponse, TextPart

        calls.append(len(calls) + 1)
        if len(calls) == 1:
            raise error
        return ModelResponse(parts=[TextPart(content="after the wait")])

    agent = Agent(FunctionModel(model), name=name, capabilities=[DjangoDurability()])
    durable.workflow(f"tests.{name}")(lambda ctx: run_agent(ctx, agent, "hi"))
    return calls


def test_a_rate_limited_request_is_tried_again_when_the_provider_said():
    import datetime as dt

    from pydantic_ai.exceptions import ModelHTTPError, ModelRateLimitError

    from django_durable.testing import clock

    calls = _failing_agent("limited", ModelHTTPError.for_category(
        ModelRateLimitError, status_code=429, model_name="gpt-4o", headers={"retry-after": "120"}))
    with clock() as frozen:
        run = durable.start("tests.limited")
        drain()
        step = Step.objects.get(run=run, key="limited__model.request:0")
        assert step.status == "retrying" and calls == [1]
        assert "asked to wait 120 s" in step.error, step.error
        assert step.retry_at == frozen.now + dt.timedelta(seconds=120)  # the provider's wait, not the back-off
        frozen.advance(seconds=119)
        drain()
        assert calls == [1]
        frozen.advance(seconds=2)
        drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "after the wait"
    assert calls == [1, 2]


def test_a_request_the_provider_rejects_is_not_tried_again():
    from pydantic_ai.exceptions import ModelAuthenticationError, ModelHTTPError

    calls = _failing_agent("rejected", ModelHTTPError.for_category(
        ModelAuthenticationError, status_code=401, model_name="gpt-4o", body={"error": "bad key"}))
    run = durable.start("tests.rejected")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "failed"
    assert calls == [1]


def test_a_workflow_tool_runs_its_workflow_as_a_child_of_the_agents_run():
    run = durable.start("tests.dispatch_agent")
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "completed", finished.error
    assert finished.get_result() == "Done: replacement for order 7 shipped"
    child = WorkflowRun.objects.get(parent=run)
    assert (child.workflow, child.status, child.get_input()["kwargs"]) == (
        "tests.ship_replacement", "completed", {"order_id": 7})
    entry = Step.objects.get(run=run, key="dispatcher__workflow:ship_replacement:0")
    assert entry.kind == "child" and entry.status == "completed"
    assert ledger.counts("pydantic-dispatch") == {"ship": 1}
    from django_durable.contrib import agent_runs

    turns, _ = agent_runs.of_run(finished)[:2]
    assert [(turn.kind, turn.tool, turn.text) for turn in turns][1:3] == [
        ("tool_call", "ship_replacement", ""), ("tool_result", "ship_replacement", "replacement for order 7 shipped")]
    assert check_run(finished).ok  # the replay starts no second child
    assert WorkflowRun.objects.filter(parent=run).count() == 1


def test_workflow_tool_calls_in_one_response_start_their_children_at_once():
    run = durable.start("tests.dispatch_agent", "replace orders 7 8")
    drain(max_items=1)  # the agent's first advance: it asks for two replacements and starts both
    children = WorkflowRun.objects.filter(parent=run)
    assert sorted(child.get_input()["kwargs"]["order_id"] for child in children) == [7, 8]
    assert {child.status for child in children} == {"pending"}
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == (
        "Done: replacement for order 7 shipped; replacement for order 8 shipped")


def test_a_workflow_tool_whose_child_fails_tells_the_model():
    run = durable.start("tests.dispatch_agent", "replace order 13")
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "completed", finished.error
    answer = finished.get_result()
    assert answer.startswith("Done: The workflow tests.ship_replacement ended failed: ") and "no stock for order 13" in answer
    assert WorkflowRun.objects.get(parent=run).status == "failed"


def test_a_workflow_tools_schema_and_its_place_in_the_shape():
    from django_durable.contrib.pydantic_ai import workflow_tool

    tool = workflow_tool("tests.ship_replacement")
    assert (tool.name, tool.description) == ("ship_replacement", "Ship a replacement for a damaged order.")
    assert tool.function_schema.json_schema["properties"] == {"order_id": {"title": "Order Id", "type": "integer"}}
    assert tool.function_schema.json_schema["required"] == ["order_id"]
    node = durable.describe("tests.dispatch_agent")["shape"][0]
    assert node["children"] == [{"name": "ship_replacement", "workflow": "tests.ship_replacement"}]
