"""What is the OpenAI Agents SDK's own in django_durable.contrib.openai_agents: the model's text
streamed from inside the request's step, the SDK's provider errors answered for the step's
retries. What both integrations promise is in tests/test_agent_integrations.py."""

from __future__ import annotations

import pytest

pytest.importorskip("agents")

import django_durable as durable  # noqa: E402
from django_durable.models import Step, WorkflowRun  # noqa: E402
from django_durable.testing import drain  # noqa: E402
from tests.testapp import openai_agents  # noqa: E402 - registers tests.openai_desk

pytestmark = pytest.mark.django_db(transaction=True)  # the steps write on threads of their own

REFUND = "desk__approval:refund:0"


def test_the_models_text_streams_from_inside_the_request(approver):
    run = durable.start("tests.openai_desk", stream="answer")
    drain()
    durable.decide(run.pk, REFUND, approver, approve=True)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    words = list(durable.read_stream(run.pk, "answer"))
    assert "".join(words) == "Order: order 7 shipped. Refund: refunded order 7. " and len(words) == 8
    entries = Step.objects.filter(run=run, kind="stream").values_list("result", flat=True)
    assert all('"step":"desk__model.request:2"' in text for text in entries), list(entries)
    assert Step.objects.get(run=run, key="desk__model.request:2").result.startswith('{"output":')  # the response too


def test_a_rate_limited_request_is_tried_again_after_the_providers_wait():
    import datetime as dt

    import httpx
    from agents import Agent
    from openai import RateLimitError

    from django_durable.contrib.openai_agents import run_agent
    from django_durable.testing import clock

    calls = []

    class Limited(openai_agents.DeskModel):
        async def get_response(self, system_instructions, input, *args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                response = httpx.Response(429, headers={"retry-after": "30"},
                                          request=httpx.Request("POST", "https://api.invalid/v1/responses"))
                raise RateLimitError("slow down", response=response, body=None)
            return await super().get_response(system_instructions, input, *args, **kwargs)

    agent = Agent(name="limited", model=Limited(), tools=[openai_agents.look_up, openai_agents.refund])
    durable.workflow("tests.openai_limited")(lambda ctx: run_agent(ctx, agent, "order 7?", approvers="testapp.approve_refund"))
    with clock() as frozen:
        run = durable.start("tests.openai_limited")
        drain()
        step = Step.objects.get(run=run, key="limited__model.request:0")
        assert step.status == "retrying" and step.retry_at == frozen.now + dt.timedelta(seconds=30), step.error
        frozen.advance(seconds=29)
        drain()
        assert calls == [1]
        frozen.advance(seconds=2)
        drain()
    assert Step.objects.get(run=run, key="limited__model.request:0").status == "completed"
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"  # on, to the refund's approval
    assert len(calls) == 3  # the limited request twice, then the one after the look-up


def test_a_request_the_provider_refuses_is_not_tried_again():
    import httpx
    from agents import Agent
    from openai import AuthenticationError

    from django_durable.contrib.openai_agents import run_agent

    class Refused(openai_agents.DeskModel):
        async def get_response(self, *args, **kwargs):
            response = httpx.Response(401, request=httpx.Request("POST", "https://api.invalid/v1/responses"))
            raise AuthenticationError("bad key", response=response, body=None)

    agent = Agent(name="refused", model=Refused())
    durable.workflow("tests.openai_refused")(lambda ctx: run_agent(ctx, agent, "hi"))
    run = durable.start("tests.openai_refused")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "failed"
    assert Step.objects.get(run=run, key="refused__model.request:0").attempts == 1


def test_a_run_configs_model_is_made_durable_for_every_agent(approver):
    """RunConfig(model=...) overrides every agent's model: run_agent wraps it in each agent's copy."""
    from agents import Agent, RunConfig

    from django_durable.contrib.openai_agents import run_agent

    agent = Agent(name="configured", model="a-name-no-provider-serves", tools=[openai_agents.look_up, openai_agents.refund])
    durable.workflow("tests.openai_configured")(lambda ctx: run_agent(
        ctx, agent, "order 7?", approvers="testapp.approve_refund", run_config=RunConfig(model=openai_agents.DeskModel())))
    run = durable.start("tests.openai_configured")
    drain()
    durable.decide(run.pk, "configured__approval:refund:0", approver, approve=True)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "Order: order 7 shipped. Refund: refunded order 7."
    keys = set(Step.objects.filter(run=run, kind="step").values_list("key", flat=True))
    assert {"configured__model.request:0", "configured__model.request:2"} <= keys, keys
