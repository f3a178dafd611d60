"""The guides' examples run: each block marked ``<!-- example: NAME -->`` in docs/guides/ is executed
as written, with the helper functions it calls defined here, and what the guide says of it is checked."""

import datetime as dt
import re
import types
from pathlib import Path

import pytest
from rest_framework.test import APIClient

import django_durable as durable
from django_durable import signals
from django_durable.models import Step, WorkflowRun
from django_durable.testing import drain
from tests.conftest import ledger_counts
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)

GUIDES = Path(__file__).resolve().parent.parent / "docs" / "guides"
_BLOCK = re.compile(r"<!-- example: (\S+)[^>]*-->\n```python\n(.*?)\n```", re.S)


def examples() -> dict[str, str]:
    return {name: code for page in sorted(GUIDES.glob("*.md")) for name, code in _BLOCK.findall(page.read_text())}


def run_example(name: str, **helpers) -> dict:
    """Execute the guide's example `name` in a namespace with `helpers`; return the namespace."""
    code = examples()[name]
    namespace = {"__name__": "shop.guide", "durable": durable, "dt": dt, **helpers}
    exec(compile(code, f"docs/guides <example {name}>", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def recorded(name):
    """A step function that records its call in the ledger under `name` and returns `name`."""
    def call(*args):
        ledger.record(args[0] if args else "-", name)
        return name
    call.__name__ = call.__qualname__ = name
    return call


def test_every_marked_example_has_a_test():
    assert set(examples()) == {"input", "switch", "notes", "describe", "describe-input", "fork", "gates", "update", "stream", "live-stream", "agent", "agent-approval", "agent-openai", "agent-workflow-tool", "patched", "since", "approval", "subject",
                               "view", "async", "fairness"}


def test_input_validation_refuses_bad_input_and_stores_nothing(capsys):
    refund_payment = recorded("refund_payment")
    namespace = run_example("input", refund_payment=refund_payment)
    printed = capsys.readouterr().out
    assert printed.startswith("Workflow 'shop.refund' refused its input: order_id: Ensure this value is greater")
    assert "amount: Ensure that there are no more than 2 decimal places." in printed
    assert "email: Enter a valid email address." in printed
    assert WorkflowRun.objects.count() == 1  # only the good one
    run = namespace["run"]
    assert run.get_input()["kwargs"]["amount"] == durable.serialization.decode('{"__durable__":"decimal","v":"19.90"}')
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"


def _switch_helpers():
    express, standard = recorded("express"), recorded("standard")
    return {
        "ship_express": lambda ctx, order: ctx.step("express", express, ctx.run_id),
        "ship_standard": lambda ctx, order: ctx.step("standard", standard, ctx.run_id),
        "flag_for_review": lambda order_id: ledger.record(order_id, "flag") or "flagged",
    }


def test_switch_takes_and_records_the_first_branch_that_fits():
    run_example("switch", **_switch_helpers())
    gold = durable.start("orders.route", {"id": 1, "tier": "gold"})
    bronze = durable.start("orders.route", {"id": 2, "tier": "bronze"})
    drain()
    assert WorkflowRun.objects.get(pk=gold.pk).get_result() == "express"
    assert WorkflowRun.objects.get(pk=bronze.pk).get_result() == "flagged"
    chosen = dict(Step.objects.filter(kind="switch").values_list("run_id", "name"))
    assert chosen == {gold.pk: "premium", bronze.pk: "manual-review"}


def test_describe_shows_every_branch_of_the_switch():
    namespace = run_example("switch", **_switch_helpers())
    namespace = run_example("describe", **namespace)
    shape = namespace["shape"]
    assert (shape["workflow"], shape["kind"]) == ("orders.route", "workflow")
    [switch] = shape["shape"]
    assert (switch["type"], switch["key"]) == ("switch", "fulfilment-route")
    branches = {branch["id"]: branch["shape"] for branch in switch["branches"]}
    assert list(branches) == ["premium", "standard", "manual-review"]
    assert [(node["type"], node["key"]) for node in branches["premium"]] == [("step", "express")]
    assert [(node["type"], node["key"]) for node in branches["manual-review"]] == [("step", "flag")]


def test_describe_for_an_input_takes_the_defaults_and_the_input():
    namespace = run_example("describe-input", ship_express=recorded("ship_express"))
    describe = namespace["durable"].describe
    assert describe("orders.review")["shape"] == [{"type": "signal", "name": "reviewed", "timeout": 172800.0}]
    given = describe("orders.review", hours=1, express=True)["shape"]
    assert [(node["type"], node.get("timeout")) for node in given] == [("signal", 3600.0), ("step", None)]
    assert given[1]["key"] == "express"


def test_fork_runs_the_fixed_step_again_and_keeps_the_one_before():
    fixed = []

    def send_invoice(order_id, total):
        ledger.record(order_id, "send")
        if not fixed:
            raise durable.NonRetryableError("the template is broken")
        return f"sent {total}"

    namespace = run_example("fork", compute_total=recorded("compute_total"), send_invoice=send_invoice)
    run = durable.start("orders.invoice", order_id=7)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "failed"
    fixed.append(True)  # the fix is deployed
    fork = namespace["send_again"](run.pk)
    assert (fork.forked_from, fork.forked_at_step) == (run.pk, "send")
    drain()
    assert WorkflowRun.objects.get(pk=fork.pk).get_result() == "sent compute_total"
    assert ledger.counts(7) == {"compute_total": 1, "send": 2}  # the total was not computed again


def test_singleton_debounce_and_throttle_as_the_guide_says():
    namespace = run_example("gates", index_document=lambda document_id, version: [document_id, version])
    assert namespace["again"].pk == namespace["first"].pk
    drain()  # the singleton's run (with its first input); the debounced one waits for quiet
    assert WorkflowRun.objects.get(pk=namespace["first"].pk).get_result() == [7, 0]
    last = WorkflowRun.objects.get(pk=namespace["last"].pk)
    assert last.status == "pending" and last.get_input()["kwargs"] == {"version": 2}
    assert WorkflowRun.objects.filter(workflow="search.reindex").count() == 3


def test_a_fair_queue_takes_the_tenants_in_turns_as_the_guide_says():
    from django.test import override_settings

    from django_durable import workpool
    from django_durable.models import WorkItem

    with override_settings(DURABLE_QUEUES={"reports": {"fairness": True}}):
        run_example("fairness", build_report=lambda month: month)
        claims = [workpool.claim(worker="guide", queues=["reports"], db="default") for _ in range(7)]
    keys = dict(WorkItem.objects.filter(queue="reports").values_list("pk", "concurrency_key"))
    assert [keys[claim.item_id] for claim in claims] == ["tenant:1", "tenant:2"] * 3 + ["tenant:1"]


def test_an_update_is_answered_or_refused_as_the_guide_says():
    from django_durable.services import updates

    namespace = run_example("update", reserve=lambda item: item)
    run = durable.start("shop.cart")
    drain()

    def ask(item):
        update_id = updates.send(run.pk, "add", item)
        drain()
        try:
            return updates.answer_of(run.pk, update_id, timeout=1)
        except durable.UpdateRejected as exc:
            return {"refused": exc.reason}

    assert ask("tea") == {"count": 1}
    assert ask("tea") == {"refused": "tea is in the cart already"}
    assert ask("checkout") == {"items": ["tea"]}
    assert callable(namespace["add_to_cart"])
    with pytest.raises(durable.RunFinished):
        namespace["add_to_cart"](run.pk, "jam")


def test_a_stream_is_read_as_the_guide_says(capsys):
    namespace = run_example("stream", draft_answer=lambda question: ["Durable ", "runs ", "resume."])
    run = durable.start("assistant.answer", question="why?")
    drain()
    namespace["print_answer"](run.pk)
    assert capsys.readouterr().out == "Durable runs resume."


def test_a_live_stream_is_read_as_the_guide_says(capsys, durable_clock):
    """The retry comes after the default back-off, in the next advance: the marker is written
    from what the journal says the first attempt wrote."""
    attempts = []

    def model_tokens(question):
        attempts.append(question)
        yield "Durable "
        if len(attempts) == 1:
            raise ConnectionError("the model's connection dropped")
        yield "runs resume."

    namespace = run_example("live-stream", model_tokens=model_tokens)
    run = durable.start("assistant.live", question="why?")
    drain()
    assert Step.objects.get(run=run, key="draft").status == "retrying"
    durable_clock.advance(seconds=120)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "Durable runs resume."
    namespace["print_live"](run.pk)
    assert capsys.readouterr().out == "Durable \n[attempt 1 of draft stopped; again:]\nDurable runs resume."


@pytest.mark.django_db(transaction=True)  # an agent's steps write on a thread of their own
def test_an_agent_runs_as_the_guide_says():
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.function import DeltaToolCall, FunctionModel

    async def model(messages, info):
        if not any(part.part_kind == "tool-return" for message in messages for part in getattr(message, "parts", [])):
            yield {0: DeltaToolCall(name="order_status", json_args='{"order_id": 7}', tool_call_id="c1")}
            return
        for piece in ["Your order ", "has shipped."]:
            yield piece

    run_example("agent", model=FunctionModel(stream_function=model))
    run = durable.start("support.answer", "where is order 7?")
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.status == "completed", finished.error
    assert finished.get_result() == "Your order has shipped."
    assert list(durable.read_stream(run.pk, "answer")) == ["Your order ", "has shipped."]
    keys = set(Step.objects.filter(run=run, kind="step").values_list("key", flat=True))
    assert "support__function_toolset__<agent>.call_tool:order_status:0" in keys, keys


@pytest.mark.django_db(transaction=True)
def test_an_agents_tool_waits_for_approval_as_the_guide_says(django_user_model):
    from django.contrib.auth.models import Permission

    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from django_durable.contrib.pydantic_ai import DjangoDurability, run_agent

    def model(messages, info):
        returned = [part for message in messages for part in getattr(message, "parts", [])
                    if part.part_kind == "tool-return"]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("refund", {"order_id": 7, "amount": 20}, tool_call_id="r1")])
        return ModelResponse(parts=[TextPart(f"Done: {returned[0].content}")])

    refunded = []

    class Order:
        class objects:
            @staticmethod
            def get(pk):
                return types.SimpleNamespace(refund=lambda amount: refunded.append((pk, amount)))

    support = Agent(FunctionModel(model), name="support", capabilities=[DjangoDurability()])
    run_example("agent-approval", support=support, run_agent=run_agent, Order=Order)
    run = durable.start("support.answer", "refund order 7")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting" and refunded == []
    approver = django_user_model.objects.create_user("ann", "ann@example.com", "a-long-password")
    approver.user_permissions.add(Permission.objects.get(codename="approve_refund", content_type__app_label="orders"))
    durable.decide(run.pk, "support__approval:refund:0", django_user_model.objects.get(pk=approver.pk), approve=True)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "Done: refunded 20"
    assert refunded == [(7, 20)]


@pytest.mark.django_db(transaction=True)
def test_a_workflow_tool_runs_as_a_child_as_the_guide_says():
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from django_durable.contrib.pydantic_ai import DjangoDurability, run_agent

    def model(messages, info):
        returned = [part.content for message in messages for part in getattr(message, "parts", [])
                    if part.part_kind == "tool-return"]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("replace", {"order_id": 7}, tool_call_id="r")])
        return ModelResponse(parts=[TextPart(f"Done: {returned[0]}")])

    run_example("agent-workflow-tool", model=FunctionModel(model), Agent=Agent, DjangoDurability=DjangoDurability,
                run_agent=run_agent, pack=recorded("pack"), ship=recorded("ship"))
    run = durable.start("support.replace", "my order 7 arrived broken")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "Done: ship"
    assert WorkflowRun.objects.get(parent=run).workflow == "orders.replace"
    assert (ledger.counts(7), ledger.counts("pack")) == ({"pack": 1}, {"ship": 1})  # ship(parcel), once each


@pytest.mark.django_db(transaction=True)
def test_an_openai_agent_runs_as_the_guide_says(django_user_model):
    pytest.importorskip("agents")
    from django.contrib.auth.models import Permission

    from tests.testapp.openai_agents import DeskModel

    run_example("agent-openai", model=DeskModel(look_up="order_status"))
    run = durable.start("support.desk", "refund order 7")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    approver = django_user_model.objects.create_user("ann", "ann@example.com", "a-long-password")
    approver.user_permissions.add(Permission.objects.get(codename="approve_refund", content_type__app_label="orders"))
    durable.decide(run.pk, "desk__approval:refund:0", django_user_model.objects.get(pk=approver.pk), approve=True)
    drain()
    finished = WorkflowRun.objects.get(pk=run.pk)
    assert finished.get_result() == "Order: order 7 shipped. Refund: refunded order 7.", finished.error
    assert "".join(durable.read_stream(run.pk, "answer")) == "Order: order 7 shipped. Refund: refunded order 7. "


def test_notes_progress_and_an_emitted_event(admin_user):
    emitted = []
    signals.run_emitted.connect(lambda sender, **kw: emitted.append(kw), weak=False, dispatch_uid="guide")
    try:
        run_example("notes", import_file=recorded("import_file"))
        run = durable.start("files.import", ["a.csv", "b.csv", "c.csv"])
        drain()
    finally:
        signals.run_emitted.disconnect(dispatch_uid="guide")
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    api = APIClient()
    api.force_authenticate(admin_user)
    body = api.get(f"/api/durable/workflows/{run.pk}/").json()
    assert [(note["message"], note["data"]) for note in body["notes"]] == [("Import started", {"files": 3})]
    assert body["progress"] == {"done": 3, "total": 3, "message": "imported c.csv"}
    assert [(kw["name"], kw["payload"]) for kw in emitted] == [("import.finished", {"files": 3})]


def test_patched_old_runs_ship_by_post_and_new_runs_by_express():
    helpers = {"pack": recorded("pack"), "ship_express": recorded("ship_express"),
               "ship_by_post": recorded("ship_by_post")}
    run_example("patched", **helpers)
    # A run the old code (no ctx.patched()) took past this point: packed and shipped by post.
    old = durable.start("orders.ship", 7)
    drain()
    Step.objects.filter(run=old).exclude(key="pack").delete()
    post = helpers["ship_by_post"]
    Step.objects.create(run=old, key="ship-post", seq=2, kind="step", name=f"{post.__module__}.{post.__qualname__}",
                        status="completed", result='"ship_by_post"')
    new = durable.start("orders.ship", 8)
    drain()
    for run in (old, new):
        durable.signal(run.pk, "delivered")
    drain()
    assert {run.pk: WorkflowRun.objects.get(pk=run.pk).status for run in (old, new)} == {
        old.pk: "completed", new.pk: "completed"}
    assert not Step.objects.filter(run=old, kind="patch").exists()
    assert Step.objects.get(run=new, kind="patch").key == "patch:express-shipping"
    assert set(Step.objects.filter(run=new).values_list("key", flat=True)) >= {"pack", "ship-express"}
    assert ledger_counts(8) == {"pack": 1, "ship_express": 1}


def test_an_event_emitted_before_the_run_started_is_taken_with_since():
    namespace = run_example("since")
    drain()
    run = WorkflowRun.objects.get(pk=namespace["run"].pk)
    assert (run.status, run.get_result()) == ("completed", "19.90")


def test_an_approval_is_decided_by_a_user_with_the_permission(django_user_model):
    from django.contrib.auth.models import Permission

    run_example("approval", refund_payment=recorded("refund_payment"))
    approver = django_user_model.objects.create_user("ann", "ann@example.com", "a-long-password")
    approver.user_permissions.add(Permission.objects.get(codename="approve_refund", content_type__app_label="orders"))
    approver = django_user_model.objects.get(pk=approver.pk)
    run = durable.start("shop.refund_approval", 42, "19.90")
    drain()
    [approval] = durable.approvals_for(approver)
    assert approval.message == "Refund 19.90 for order 42?"
    durable.decide(run.pk, "approval", approver, approve=True)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "refunded, approved by ann"


def test_runs_of_a_model_instance_one_at_a_time():
    from example_project.orders.models import Order

    namespace = run_example("subject", Order=Order, handle_order=recorded("handle_order"))
    order, run = namespace["order"], namespace["run"]
    assert [r.pk for r in namespace["durable"].runs_for(order)] == [run.pk]
    with pytest.raises(durable.SubjectBusy):
        durable.start("orders.handle", order.pk, subject=order)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    durable.start("orders.handle", order.pk, subject=order)  # the first one finished


@pytest.mark.urls("tests.urls")
def test_a_durable_view_answers_202_then_its_status_url_reaches_the_result(client):
    from django.test import RequestFactory

    from example_project.orders.workflows import create_demo_order

    namespace = run_example("view")
    order = create_demo_order("ann", "19.90")
    view = namespace["fulfil_order"]
    from django_durable import views

    original = views.respond

    def no_budget(request, workflow, **kwargs):  # no worker in this test: the slow answer
        return original(request, workflow, **{**kwargs, "budget": 0})

    views.respond = no_budget
    try:
        response = view(RequestFactory().post(f"/orders/{order.pk}/fulfil/"), order_id=order.pk)
    finally:
        views.respond = original
    assert response.status_code == 202
    url = response["Location"]
    assert client.get(url).json()["finished"] is False
    drain()
    body = client.get(url).json()
    assert (body["status"], body["finished"]) == ("completed", True)


@pytest.mark.timeout(120)
def test_an_async_workflow_with_an_async_step():
    import asyncio
    import textwrap
    from decimal import Decimal

    from asgiref.sync import sync_to_async
    from django.db import connections

    code = examples()["async"]
    definitions, usage = code.split("\nrun = await", 1)
    namespace = {"__name__": "shop.guide", "durable": durable, "asyncio": asyncio, "Decimal": Decimal}
    exec(compile(definitions, "docs/guides <example async>", "exec"), namespace)  # noqa: S102
    body = "async def main():\n" + textwrap.indent("run = await" + usage + "\nreturn result", "    ")
    exec(compile(body, "docs/guides <example async>", "exec"), namespace)  # noqa: S102

    async def main():
        try:
            return await namespace["main"]()
        finally:
            await sync_to_async(connections.close_all)()

    # The workflow exists in this process only: drain() runs it while main() waits for it.
    assert asyncio.run(_with_drain(main)) == "10.8000"


async def _with_drain(main):
    import asyncio

    from asgiref.sync import sync_to_async

    task = asyncio.ensure_future(main())
    for _ in range(200):
        if task.done():
            break
        await sync_to_async(drain)()
        await asyncio.sleep(0.05)
    return await task
