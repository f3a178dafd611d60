"""A workflow's declared input (``input=`` a DRF serializer or a callable) refuses bad input before
anything is stored, from Python, start_many, the admin, the CLI and REST; the schema shows it."""

import decimal
import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework import serializers
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import WorkflowRun

pytestmark = pytest.mark.django_db


class RefundInput(serializers.Serializer):
    order_id = serializers.IntegerField(min_value=1)
    email = serializers.EmailField(help_text="Where the receipt goes.")
    amount = serializers.DecimalField(max_digits=8, decimal_places=2)
    reason = serializers.ChoiceField(choices=["damaged", "late"], required=False)


@durable.workflow("tests.input.refund", input=RefundInput)
def refund(ctx, order_id, email, amount, reason="damaged"):
    return [order_id, email, str(amount), reason]


def positive(quantity):
    if quantity <= 0:
        raise ValueError("quantity must be positive")
    return {"quantity": int(quantity)}


@durable.workflow("tests.input.restock", input=positive)
def restock(ctx, quantity):
    return quantity


def test_python_refuses_bad_input_and_stores_the_cleaned_input():
    with pytest.raises(durable.InvalidInput) as refused:
        durable.start(refund, order_id=0, email="nope", amount="1.234")
    assert set(refused.value.errors) == {"order_id", "email", "amount"}
    assert isinstance(refused.value, durable.InvalidArguments)  # caught where bad arguments are
    assert not WorkflowRun.objects.exists()
    run = durable.start(refund, 7, "ann@example.com", amount="19.90")  # positional arguments too
    stored = run.get_input()
    assert stored == {"args": [], "kwargs": {"order_id": 7, "email": "ann@example.com",
                                             "amount": decimal.Decimal("19.90")}}


def test_a_callable_validates_and_cleans():
    with pytest.raises(durable.InvalidInput, match="quantity must be positive"):
        durable.start(restock, quantity=-1)
    assert durable.start(restock, quantity=3.0).get_input()["kwargs"] == {"quantity": 3}


def test_start_many_refuses_the_whole_batch():
    with pytest.raises(durable.InvalidInput, match=r"calls\[1\]"):
        durable.start_many(restock, [{"quantity": 1}, {"quantity": 0}])
    assert not WorkflowRun.objects.exists()


def test_rest_answers_400_with_the_fields(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    response = client.post("/api/durable/workflows/", {"workflow": "tests.input.refund",
                                                        "kwargs": {"order_id": 3, "email": "x", "amount": "5"}},
                           format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input" and list(error["fields"]) == ["kwargs.email"]
    assert not WorkflowRun.objects.exists()
    ok = client.post("/api/durable/workflows/", {"workflow": "tests.input.refund",
                                                  "kwargs": {"order_id": 3, "email": "a@b.co", "amount": "5"}},
                     format="json")
    assert ok.status_code == 201


def test_the_command_line_and_the_admin_refuse_it(admin_client):
    with pytest.raises(CommandError, match="refused its input"):
        call_command("durable", "start", "tests.input.restock", "--kwargs", '{"quantity": 0}', stdout=io.StringIO())
    page = admin_client.post("/admin/django_durable/workflowrun/start/",
                             {"workflow": "tests.input.restock", "args": "[]", "kwargs": '{"quantity": 0}'})
    assert page.status_code == 200 and "quantity must be positive" in page.content.decode()
    assert not WorkflowRun.objects.exists()


def test_the_schema_and_the_definitions_show_the_input(admin_user):
    from drf_spectacular.validation import validate_schema

    client = APIClient()
    client.force_authenticate(admin_user)
    schema = json.loads(client.get("/api/durable/schema/?format=json").content)
    validate_schema(schema)
    component = schema["components"]["schemas"]["WorkflowInput.tests.input.refund"]
    assert component["required"] == ["order_id", "email", "amount"]
    assert component["properties"]["email"] == {"type": "string", "format": "email",
                                                "description": "Where the receipt goes."}
    assert component["properties"]["reason"] == {"enum": ["damaged", "late"]}
    start = next(s for name, s in schema["components"]["schemas"].items() if name in ("Start", "StartRequest"))
    assert {"$ref": "#/components/schemas/WorkflowInput.tests.input.refund"} in start["properties"]["kwargs"]["anyOf"]
    definition = client.get("/api/durable/workflows/definitions/tests.input.refund/").json()
    assert definition["input_schema"]["properties"]["amount"] == {"type": "string", "format": "decimal"}
    assert client.get("/api/durable/workflows/definitions/tests.input.restock/").json()["input_schema"] is None
