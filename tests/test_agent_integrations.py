"""What both agent integrations promise, run against each (django_durable.contrib.pydantic_ai and
.openai_agents, sharing contrib.agent_runs): the same refund desk in each framework — look order 7
up, ask to refund it with a tool that needs approval, answer with what the tools returned — whose
refund waits for someone with the permission, whose rejection reaches the model, whose shape shows
the loop, whose run reads back as a conversation with its usage and cost (in the admin too), and
whose refund runs once though a worker is SIGKILLed after it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("agents")

import django_durable as durable  # noqa: E402
from django_durable.contrib import agent_runs  # noqa: E402
from django_durable.models import Approval, Step, WorkflowRun  # noqa: E402
from django_durable.replaycheck import check_run  # noqa: E402
from django_durable.testing import drain  # noqa: E402
from tests.harness.workers import ON_POSTGRES, wait_for  # noqa: E402
from tests.testapp import agents, ledger, openai_agents  # noqa: E402 - register the desks' workflows

pytestmark = pytest.mark.django_db(transaction=True)  # the steps write on threads of their own

ANSWER = "Order: order 7 shipped. Refund: refunded order 7."


@dataclass(frozen=True)
class Desk:
    workflow: str
    agent: object
    run_agent: object
    ledger: str  # where its model and tools count their calls
    refund_step: str
    env: str  # DURABLE_TEST_AGENTS for a worker that has it

    @property
    def name(self) -> str:
        return self.agent.name

    @property
    def approval(self) -> str:
        return f"{self.name}__approval:refund:0"


def _pydantic_ai() -> Desk:
    from django_durable.contrib.pydantic_ai import run_agent

    return Desk("tests.refund_agent", agents.refunder, run_agent, "pydantic-desk",
                "refunder__function_toolset__<agent>.call_tool:refund:0", "1")


def _openai_agents() -> Desk:
    from django_durable.contrib.openai_agents import run_agent

    return Desk("tests.openai_desk", openai_agents.desk, run_agent, "openai-agent", "desk__tool.call_tool:refund:0",
                "openai")


@pytest.fixture(params=["pydantic-ai", "openai-agents"])
def desk(request) -> Desk:
    return {"pydantic-ai": _pydantic_ai, "openai-agents": _openai_agents}[request.param]()


def approved(desk: Desk, approver) -> WorkflowRun:
    run = durable.start(desk.workflow)
    drain()
    durable.decide(run.pk, desk.approval, approver, approve=True)
    drain()
    return WorkflowRun.objects.get(pk=run.pk)


def test_a_tool_that_needs_approval_waits_for_someone_with_the_permission(desk, approver, django_user_model):
    from django.core.exceptions import PermissionDenied

    run = durable.start(desk.workflow)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    approval = Approval.objects.get(run=run)
    assert (approval.key, approval.permission, approval.data["tool"], approval.data["args"]) == (
        desk.approval, "testapp.approve_refund", "refund", {"order_id": 7})
    assert approval.message == f"The agent {desk.name} asks to call refund(order_id=7)."
    assert ledger.counts(desk.ledger) == {"model": 2, "look_up": 1}  # asked; the refund has not run
    bob = django_user_model.objects.create_user("bob", "bob@example.com", "a-long-password", is_staff=True)
    with pytest.raises(PermissionDenied):
        durable.decide(run.pk, desk.approval, bob, approve=True)
    durable.decide(run.pk, desk.approval, approver, approve=True)
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "completed", finished.error
    assert finished.get_result() == ANSWER
    assert ledger.counts(desk.ledger) == {"model": 3, "look_up": 1, "refund": 1}
    assert check_run(finished).ok  # the replay neither asks again nor refunds again
    assert ledger.counts(desk.ledger) == {"model": 3, "look_up": 1, "refund": 1}


def test_a_rejected_tool_call_tells_the_model_who_denied_it_and_does_not_run(desk, approver):
    run = durable.start(desk.workflow)
    drain()
    durable.decide(run.pk, desk.approval, approver, approve=False, comment="over the limit")
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "completed", finished.error
    assert finished.get_result() == "Order: order 7 shipped. Refund: The tool call was denied by alice: over the limit."
    assert "refund" not in ledger.counts(desk.ledger)


def test_a_tool_that_needs_approval_without_approvers_fails_the_run_saying_so(desk):
    name = f"tests.{desk.name}_unguarded"
    durable.workflow(name)(lambda ctx: desk.run_agent(ctx, desk.agent, "refund order 7"))
    run = durable.start(name)
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "failed"
    assert "was given no approvers" in finished.get_error()["message"]
    problems = durable.describe(name)["problems"]
    assert any("needs approval and no approvers" in problem for problem in problems), problems


def test_the_shape_shows_the_agents_loop_and_who_approves(desk):
    shape = durable.describe(desk.workflow)
    assert shape["problems"] == []
    node = shape["shape"][0]
    assert (node["type"], node["agent"], node["tools"]) == ("agent", desk.name, ["look_up", "refund"])
    assert node["approvals"] == [{"name": "refund", "approvers": "permission testapp.approve_refund"}]
    from django_durable.management.commands.durable import shape_lines

    assert shape_lines([node], "")[1:] == ["  wait for approval before refund by permission testapp.approve_refund"]
    assert shape_lines([node], "")[0].startswith(f"agent {desk.name} on ")


def test_the_run_reads_back_as_a_conversation_with_its_usage_and_cost(desk, approver):
    run = approved(desk, approver)
    turns, usage = agent_runs.read(Step.objects.filter(run=run).order_by("seq"))
    assert [(turn.kind, turn.tool, turn.text, turn.status) for turn in turns] == [
        ("prompt", "", "refund order 7", "completed"), ("tool_call", "look_up", "", ""),
        ("tool_result", "look_up", "order 7 shipped", "completed"), ("tool_call", "refund", "", ""),
        ("approval", "refund", "alice", "approved"), ("tool_result", "refund", "refunded order 7", "completed"),
        ("text", "", ANSWER, "")]
    assert (usage.requests, usage.models, usage.unpriced) == (3, ["gpt-4o"], 0)
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    expected = (usage.input_tokens * 2.5 + usage.output_tokens * 10) / 1_000_000  # gpt-4o's price per token
    assert abs(float(usage.cost) - expected) < 1e-9, (usage.cost, expected)


def test_the_admin_reads_an_agent_run_as_a_conversation_and_the_api_gives_its_usage(desk, approver, admin_client):
    run = approved(desk, approver)
    page = admin_client.get(f"/admin/django_durable/workflowrun/{run.pk}/change/").content.decode()
    start = page.index('id="durable-conversation"')
    conversation = page[start:page.index("</ol>", start)]
    order = ["refund order 7", "calls</strong> <code>look_up</code>", "order 7 shipped",
             "calls</strong> <code>refund</code>", "approved", "refunded order 7", ANSWER]
    positions = [conversation.find(text) for text in order]
    assert -1 not in positions and positions == sorted(positions), positions
    assert "3 model requests" in page and "cost $0.0" in page
    usage = admin_client.get(f"/api/durable/workflows/{run.pk}/").json()["agent_usage"]
    assert (usage["requests"], usage["models"], usage["unpriced"]) == (3, ["gpt-4o"], 0)
    assert usage["cost"].startswith("0.00") and float(usage["cost"]) > 0
    definition = admin_client.get(f"/admin/django_durable/definition/{desk.workflow}/").content.decode()
    assert "wait for approval</strong> before <code>refund</code> by permission testapp.approve_refund" in definition


@pytest.mark.processes
@pytest.mark.timeout(360)
@pytest.mark.skipif(not ON_POSTGRES, reason="an agent's replay does not depend on the database: killed once, on PostgreSQL")
def test_a_worker_killed_after_an_approved_refund_does_not_refund_again(desk, start_worker, tmp_path, approver):
    """RELIABILITY T52: the run waits for the refund's approval with no worker holding it; once
    approved, the refund runs, and the worker is SIGKILLed in the model request after it. The next
    worker replays the requests, the look-up, the approval and the refund from the journal: the
    refund ran once, and only the request in flight is made again."""
    hold = str(tmp_path / "hold")
    env = {"DURABLE_TEST_AGENT_HOLD": hold, "DURABLE_TEST_AGENTS": desk.env}
    run = durable.start(desk.workflow)
    first = start_worker(burst=False, env=env)
    wait_for(lambda: Approval.objects.filter(run=run).exists(), timeout=150, message="the refund's approval to open")
    durable.decide(run.pk, desk.approval, approver, approve=True)
    wait_for(lambda: (tmp_path / "hold.held").exists(), timeout=150, message="the request after the refund to start")
    first.kill()
    second = start_worker(env=env)
    assert second.wait(150) == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == ANSWER
    assert ledger.counts(desk.ledger) == {"model": 4, "look_up": 1, "refund": 1}  # the request in flight twice
    assert Step.objects.get(run=run, key=desk.refund_step).attempts == 1


def test_an_approval_with_a_timeout_that_nobody_decides_fails_the_run(desk):
    from django_durable.testing import clock

    name = f"tests.{desk.name}_hurried"
    durable.workflow(name)(lambda ctx: desk.run_agent(ctx, desk.agent, "refund order 7",
                                                      approvers="testapp.approve_refund", approval_timeout=60))
    with clock() as frozen:
        run = durable.start(name)
        drain()
        assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
        frozen.advance(seconds=61)
        drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "failed" and finished.get_error()["type"].endswith("ApprovalTimeout"), finished.error
    assert "refund" not in ledger.counts(desk.ledger)


def test_a_providers_wait_is_capped_at_the_retry_policys_longest_back_off():
    from django_durable.exceptions import NonRetryableError, RetryAfter

    error = RuntimeError("slow down")
    assert agent_runs.retry_answer(error, status=429, retry_after=600, ceiling=30).seconds == 30
    assert agent_runs.retry_answer(error, status=429, retry_after=12, ceiling=None).seconds == 12
    assert isinstance(agent_runs.retry_answer(error, status=429, retry_after=12), RetryAfter)
    assert isinstance(agent_runs.retry_answer(error, status=400, retry_after=None), NonRetryableError)
    assert agent_runs.retry_answer(error, status=503, retry_after=None) is error  # the policy's back-off
