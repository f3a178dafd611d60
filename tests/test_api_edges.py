"""Issue 30: the REST API's edges, through Django's test client with CSRF checks on, as curl and a
browser meet them: JSON for every error, a short id told to be whole, refusals that name what is
missing, and the metrics endpoint behind the API's own authentication."""

import base64

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

import django_durable as durable
from django_durable.testing import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.urls")]

API = "/api/durable/"


def basic(username: str, password: str = "a-long-password") -> dict:
    token = base64.b64encode(f"{username}:{password}".encode()).decode()
    return {"HTTP_AUTHORIZATION": f"Basic {token}"}


@pytest.fixture
def ops(django_user_model):
    return django_user_model.objects.create_superuser("ops", "ops@example.com", "a-long-password")


@pytest.fixture
def curl():
    return Client(enforce_csrf_checks=True)


def error_of(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), (response.status_code, response.content[:200])
    return response.json()["error"]


@pytest.mark.parametrize("method, path", [
    ("delete", "workflows/57c4667f/"),
    ("post", "workflows/57c4667f/retry/"),
    ("post", "workflows/57c4667f/signals/approved/"),
    ("post", "workflows/not-a-uuid/signals/x/"),
    ("post", "workflows/not-a-uuid/retry/"),
    ("post", "workflows/57c4667f/approvals/manager/"),
    ("post", "events/"),
    ("delete", "no/such/route/"),
])
def test_a_malformed_path_is_a_json_404_with_csrf_checks_on(curl, ops, method, path):
    response = getattr(curl, method)(f"{API}{path}", **basic("ops"))
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_a_short_id_is_told_to_be_whole_and_events_to_be_named(curl, ops):
    short = error_of(curl.delete(f"{API}workflows/57c4667f/", **basic("ops")))["message"]
    assert "'57c4667f'" in short and "whole id" in short and "36" in short
    assert "events/<name>/" in error_of(curl.post(f"{API}events/", **basic("ops")))["message"]


def test_a_session_caller_gets_json_for_a_malformed_id_too(curl, ops):
    curl.force_login(ops)
    response = curl.post(f"{API}workflows/57c4667f/retry/")
    assert response.status_code == 404 and "whole id" in error_of(response)["message"]


def test_every_refusal_names_what_is_missing(curl, django_user_model):
    run = durable.start("tests.approval")
    drain()
    django_user_model.objects.create_user("plain", password="a-long-password")
    not_staff = curl.get(f"{API}workflows/{run.pk}/", **basic("plain"))
    assert not_staff.status_code == 403 and "staff status" in error_of(not_staff)["message"]

    staff = django_user_model.objects.create_user("staff", password="a-long-password", is_staff=True)
    refused = curl.delete(f"{API}workflows/{run.pk}/", **basic("staff"))
    assert refused.status_code == 403
    assert "django_durable.view_workflowrun" in error_of(refused)["message"] or \
        "django_durable.cancel_workflowrun" in error_of(refused)["message"]
    staff.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    refused = curl.delete(f"{API}workflows/{run.pk}/", **basic("staff"))
    assert "django_durable.cancel_workflowrun" in error_of(refused)["message"]
    assert durable.get_run(run.pk).status == "waiting"


def test_the_metrics_take_the_apis_authentication_and_answer_json_when_refused(curl, ops, django_user_model,
                                                                              settings):
    pytest.importorskip("prometheus_client")
    scraped = curl.get("/durable/metrics/", **basic("ops"))
    assert scraped.status_code == 200 and scraped["Content-Type"].startswith("text/plain")
    assert b"durable_workers_live" in scraped.content

    stranger = curl.get("/durable/metrics/")
    assert stranger.status_code == 401 and error_of(stranger)["code"] == "not_authenticated"
    django_user_model.objects.create_user("staff", password="a-long-password", is_staff=True)
    refused = curl.get("/durable/metrics/", **basic("staff"))
    assert refused.status_code == 403 and "django_durable.view_workflowrun" in error_of(refused)["message"]
    wrong = curl.get("/durable/metrics/", HTTP_AUTHORIZATION="Bearer wrong")
    assert wrong.status_code == 401 and error_of(wrong)["code"] == "authentication_failed"
    settings.DURABLE_METRICS_TOKEN = "s3cret"
    assert curl.get("/durable/metrics/", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200
    curl.force_login(ops)
    assert curl.get("/durable/metrics/", HTTP_ACCEPT="application/json").status_code == 200


def test_without_prometheus_client_the_501_comes_after_the_authentication(curl, ops, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_prometheus(name, *args, **kwargs):
        if name.startswith("prometheus_client"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_prometheus)
    assert curl.get("/durable/metrics/").status_code == 401
    missing = curl.get("/durable/metrics/", **basic("ops"))
    assert missing.status_code == 501 and "prometheus-client" in error_of(missing)["message"]


def test_a_body_that_is_not_json_is_a_415_the_error_table_names(curl, ops):
    from pathlib import Path

    response = curl.post(f"{API}workflows/", "workflow=tests.three_steps",
                         content_type="application/x-www-form-urlencoded", **basic("ops"))
    assert response.status_code == 415 and error_of(response)["code"] == "unsupported_media_type"
    table = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    assert "| 415 | `unsupported_media_type`" in table


def test_an_unknown_run_id_is_a_404_that_names_the_id(admin_client):
    missing = "01900000-0000-7000-8000-000000000000"
    answer = admin_client.get(f"/api/durable/workflows/{missing}/")
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == f"No workflow run has the id {missing}."


@pytest.mark.django_db(transaction=True)
def test_a_cancel_takes_its_reason_from_a_json_body_too(admin_client):
    import django_durable as durable
    from django_durable.models import WorkflowRun

    run = durable.start("tests.approval")
    answer = admin_client.delete(f"/api/durable/workflows/{run.pk}/", {"reason": "the customer called"},
                                 content_type="application/json")
    assert answer.status_code == 202, answer.content
    assert "the customer called" in WorkflowRun.objects.get(pk=run.pk).error
    other = durable.start("tests.approval")
    refused = admin_client.delete(f"/api/durable/workflows/{other.pk}/", {"why": "x"}, content_type="application/json")
    assert refused.status_code == 400 and "?reason=" in refused.content.decode()
