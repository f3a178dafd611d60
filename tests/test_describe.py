"""durable.describe() and durable.workflows(): a workflow's shape and definition, without running it."""

import io
import json

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import Step, WorkflowRun

called: list = []


def charge(order):
    called.append("charge")
    return {"id": "ch_1"}


def refund(charge):
    called.append("refund")


def ship_express(order):
    called.append("ship")


def label(item):
    called.append("label")


@durable.workflow("tests.describe.order", queue="orders", retry=durable.RetryPolicy(max_attempts=5))
def order_flow(ctx, order_id: int, express=False):
    """Charge, ship by the customer's tier, label every item, e-mail the receipt."""
    order = ctx.step("load", lambda: {"tier": "gold", "items": [1, 2]})
    ctx.step("charge", charge, order, compensate=refund)
    ctx.switch("route", order["tier"], {
        "premium": (lambda tier: tier in ("gold", "premium"), lambda tier: ctx.step("express", ship_express, order)),
        "standard": ("standard", lambda tier: ctx.wait_for_signal("picked")),
    }, default=lambda tier: ctx.sleep("later", 60))
    for item in order["items"]:
        ctx.step(f"check:{item}", label, item)
    ctx.map("labels", label, order["items"])
    ctx.wait_for_event("payment.settled", match={"order": order_id})
    ctx.child("receipt", "tests.three_steps", x=1)
    ctx.emit("order.done", {"order": order_id})
    if order["total"] > 10:  # an `if` on data: its true side shows
        ctx.step("bonus", label, 0)
    order["when"].fromisoformat()  # a stand-in's attribute is another stand-in: still fine
    return order


def test_describe_records_the_shape_and_runs_no_step():
    called.clear()
    described = durable.describe(order_flow)
    assert called == []
    assert described["workflow"] == "tests.describe.order"
    assert described["description"].startswith("Charge, ship by the customer's tier")
    shape = described["shape"]
    assert [node["type"] for node in shape] == [
        "step", "step", "switch", "step", "map", "event", "child", "emit", "step"]
    assert shape[1] == {"type": "step", "key": "charge", "function": "tests.test_describe.charge",
                        "compensate": "tests.test_describe.refund"}
    switch = shape[2]
    assert [(b["id"], [n["type"] for n in b["shape"]]) for b in switch["branches"]] == [
        ("premium", ["step"]), ("standard", ["signal"]), ("default", ["sleep"])]
    assert shape[3]["key"] == "check:*"  # a loop over data: once, its key marked where data goes
    assert shape[4] == {"type": "map", "key": "labels", "function": "tests.test_describe.label"}
    assert shape[5] == {"type": "event", "name": "payment.settled", "match": ["order"]}
    assert shape[6] == {"type": "child", "key": "receipt", "workflow": "tests.three_steps"}


@pytest.mark.django_db
def test_describing_writes_nothing():
    durable.describe("tests.describe.order")
    assert not WorkflowRun.objects.exists() and not Step.objects.exists()


def test_code_that_cannot_go_on_with_stand_ins_ends_the_shape_with_a_reason():
    import datetime as dt

    @durable.workflow("tests.describe.parses")
    def parses(ctx):
        stamp = ctx.step("stamp", lambda: "2026-01-01")
        ctx.sleep_until("then", dt.datetime.fromisoformat(stamp))
        ctx.step("after", label, 1)

    shape = durable.describe(parses)["shape"]
    assert shape[0]["type"] == "step" and shape[1]["type"] == "stop"
    assert "fromisoformat" in shape[1]["reason"] or "str" in shape[1]["reason"]


def test_workflows_lists_definitions_as_data():
    found = {d["name"]: d for d in durable.workflows()}
    order = found["tests.describe.order"]
    assert (order["kind"], order["queue"], order["retry"]["max_attempts"]) == ("workflow", "orders", 5)
    assert order["input"] == [{"name": "order_id", "kind": "positional_or_keyword", "annotation": "int"},
                              {"name": "express", "kind": "positional_or_keyword", "default": "False"}]
    assert order["shape"][0]["key"] == "load"
    json.dumps(durable.workflows())  # all of it is JSON


@pytest.mark.django_db
def test_the_api_the_command_and_the_admin_show_definitions(admin_user, admin_client, django_user_model):
    client = APIClient()
    client.force_authenticate(admin_user)
    listed = client.get("/api/durable/workflows/definitions/")
    assert listed.status_code == 200
    assert "tests.describe.order" in {d["name"] for d in listed.json()}
    one = client.get("/api/durable/workflows/definitions/tests.describe.order/")
    assert one.status_code == 200 and one.json()["shape"][2]["type"] == "switch"
    assert client.get("/api/durable/workflows/definitions/no.such/").status_code == 404
    stranger = APIClient()
    stranger.force_authenticate(django_user_model.objects.create_user("nobody", is_staff=True))
    assert stranger.get("/api/durable/workflows/definitions/").status_code == 403

    out = io.StringIO()
    call_command("durable", "workflows", stdout=out)
    text = out.getvalue()
    assert "tests.describe.order  (workflow, queue orders)  Charge, ship" in text
    assert "    switch route:" in text and "      branch premium:" in text and "        step express:" in text

    page = admin_client.get("/admin/django_durable/definition/")
    assert page.status_code == 200 and "tests.describe.order" in page.content.decode()
    detail = admin_client.get("/admin/django_durable/definition/tests.describe.order/").content.decode()
    assert "compensated by tests.test_describe.refund" in detail and "branch <code>premium</code>" in detail
    assert admin_client.get("/admin/django_durable/definition/no.such/").status_code == 404


def test_a_tasks_definition_is_its_function():
    from django_durable import registry

    name = next(d.name for d in registry.definitions() if d.kind == "task" and d.name.endswith(".meaning_of_life"))
    described = durable.describe(name)
    assert described["kind"] == "task"
    assert described["shape"] == [{"type": "call", "function": "tests.testapp.tasks.meaning_of_life"}]
    listed = next(d for d in durable.workflows() if d["name"] == name)
    assert listed["input"] == [] and listed["shape"] == described["shape"]


@durable.workflow("tests.describe.defaults")
def review_flow(ctx, order_id, hours=48, express=False):
    """A wait whose timeout comes from a defaulted argument, and a branch on the input."""
    import datetime as dt

    ctx.step("load", label, order_id)
    ctx.wait_for_signal("reviewed", timeout=dt.timedelta(hours=hours))
    if express:
        ctx.step("express", ship_express, order_id)
    ctx.sleep("cool-off", hours * 60)
    ctx.step("close", label, order_id)


def test_describe_gives_parameters_their_defaults_and_takes_an_input():
    shape = durable.describe(review_flow)["shape"]
    # Without input, hours takes its default: the wait is described, not the end of the shape.
    assert [node["type"] for node in shape] == ["step", "signal", "sleep", "step"]
    assert shape[1] == {"type": "signal", "name": "reviewed", "timeout": 48 * 3600.0}
    assert shape[2] == {"type": "sleep", "key": "cool-off", "seconds": 48 * 60.0}

    given = durable.describe("tests.describe.defaults", order_id=7, hours=1, express=True)["shape"]
    assert [node.get("key", node.get("name")) for node in given] == ["load", "reviewed", "express", "cool-off", "close"]
    assert given[1]["timeout"] == 3600.0
    assert durable.describe(review_flow)["shape"] == shape  # the input did not change the default recording

    with pytest.raises(durable.InvalidArguments, match="'colour'"):
        durable.describe(review_flow, colour="red")


def test_a_timeout_from_data_is_still_shown_as_one():
    @durable.workflow("tests.describe.data_timeout")
    def data_timeout(ctx, hours):  # no default: "some" data
        ctx.wait_for_signal("go", timeout=hours)
        ctx.step("after", label, 1)

    assert durable.describe(data_timeout)["shape"] == [
        {"type": "signal", "name": "go", "timeout": True},
        {"type": "step", "key": "after", "function": "tests.test_describe.label"}]


@pytest.mark.django_db
def test_the_api_the_command_and_the_admin_describe_for_an_input(admin_user, admin_client):
    client = APIClient()
    client.force_authenticate(admin_user)
    url = "/api/durable/workflows/definitions/tests.describe.defaults/describe/"
    answer = client.post(url, {"kwargs": {"express": True, "hours": 2}}, format="json")
    assert answer.status_code == 200, answer.content
    assert [node["type"] for node in answer.json()["shape"]] == ["step", "signal", "step", "sleep", "step"]
    assert answer.json()["shape"][1]["timeout"] == 7200.0
    refused = client.post(url, {"kwargs": {"colour": "red"}}, format="json")
    assert refused.status_code == 400 and "colour" in refused.content.decode()
    assert client.post("/api/durable/workflows/definitions/no.such/describe/", {}, format="json").status_code == 404

    out = io.StringIO()
    call_command("durable", "describe", "tests.describe.defaults", "--kwargs", '{"hours": 1}', stdout=out)
    assert "    wait for signal reviewed (timeout 3600 s)" in out.getvalue()

    page = admin_client.get("/admin/django_durable/definition/tests.describe.defaults/",
                            {"input": '{"express": true}'}).content.decode()
    assert "<code>express</code>" in page and "timeout 172800 s" in page
    plain = admin_client.get("/admin/django_durable/definition/tests.describe.defaults/").content.decode()
    assert "<code>express</code>" not in plain
    wrong = admin_client.get("/admin/django_durable/definition/tests.describe.defaults/", {"input": "[1]"})
    assert "errornote" in wrong.content.decode()
