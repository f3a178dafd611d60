"""The REST API through DRF's test client: every route, who may call it, and what it refuses.

RELIABILITY T27 (DELETE idempotent), T36 (unregistered names), T37 (authn, authz, CSRF,
throttle, AllowAny), T38 (malformed ids), T39 (no payload leak).
"""

import base64
import importlib
import json
import uuid

import pytest
from django.contrib.auth.models import Permission
from django.core.cache import cache
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

import django_durable as durable
from django_durable import schedules
from django_durable.models import Schedule, WorkflowEvent, WorkflowRun
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/durable/"
SECRET = "card-4242-secret"


@pytest.fixture(autouse=True)
def fresh_throttles():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def user(django_user_model):
    """A user with exactly the given django_durable permissions (staff unless told otherwise)."""

    def make(*codenames, staff=True):
        person = django_user_model.objects.create_user(f"u-{uuid.uuid4().hex[:6]}", password="pw", is_staff=staff)
        person.user_permissions.set(Permission.objects.filter(content_type__app_label="django_durable",
                                                              codename__in=codenames))
        return person

    return make


@pytest.fixture
def api(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    return client


def as_user(person) -> APIClient:
    client = APIClient()
    client.force_authenticate(person)
    return client


def error_code(response) -> str:
    return response.json()["error"]["code"]


# -- the routes -----------------------------------------------------------------------------------


def test_start_poll_and_read_a_run(api):
    response = api.post(f"{API}workflows/", {"workflow": "tests.three_steps", "kwargs": {"x": 2}}, format="json")
    assert response.status_code == 201
    run = response.json()
    assert (run["workflow"], run["status"], run["input"]) == ("tests.three_steps", "pending", {"args": [], "kwargs": {"x": 2}})
    drain()
    body = api.get(f"{API}workflows/{run['id']}/").json()
    assert (body["status"], body["result"], body["error"], body["steps"]) == ("completed", [2, 3, 4], None, {"completed": 3})
    assert body["journal"] is None
    journal = api.get(f"{API}workflows/{run['id']}/?include=steps").json()["journal"]
    assert [(s["key"], s["status"], s["result"]) for s in journal] == [("a", "completed", 2), ("b", "completed", 3),
                                                                      ("c", "completed", 4)]
    assert WorkflowEvent.objects.get(run_id=run["id"]).type == "started"


def test_start_options_and_idempotency(api):
    first = api.post(f"{API}workflows/", {"workflow": "tests.approval", "idempotency_key": "order-7", "queue": "slow",
                                          "priority": 5, "delay": 60, "concurrency_key": "tenant:7"}, format="json")
    assert first.status_code == 201 and first.json()["concurrency_key"] == "tenant:7"
    again = api.post(f"{API}workflows/", {"workflow": "tests.approval", "idempotency_key": "order-7"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    run = WorkflowRun.objects.get()
    assert (run.queue, run.priority, run.scheduled_at is not None) == ("slow", 5, True)
    both = api.post(f"{API}workflows/", {"workflow": "tests.approval", "delay": 1, "run_at": "2030-01-01T00:00:00Z"},
                    format="json")
    assert both.status_code == 400 and "delay" in both.json()["error"]["fields"]
    for bad in ({"workflow": "tests.approval", "args": {"a": 1}}, {"workflow": "tests.approval", "kwargs": [1]},
                {"workflow": "tests.approval", "priority": 2**40}, {"workflow": "tests.approval", "delay": -1},
                {"workflow": "tests.approval", "concurrency_key": "k" * 201},
                {"args": []}):
        response = api.post(f"{API}workflows/", bad, format="json")
        assert response.status_code == 400 and error_code(response) == "invalid", bad
    assert WorkflowRun.objects.count() == 1


@pytest.mark.parametrize("name", ["unregistered", "os.system", "django.core.management.call_command", "../x",
                                  "x" * 10_000, "", "tests.three_steps\u200b", "tеsts.three_steps"])
def test_only_registered_workflows_start_and_nothing_is_imported(api, monkeypatch, name):
    def no_import(*args, **kwargs):
        raise AssertionError("nothing may be imported from a workflow name")

    monkeypatch.setattr(importlib, "import_module", no_import)
    response = api.post(f"{API}workflows/", {"workflow": name}, format="json")
    assert response.status_code == 400
    assert error_code(response) in ("unknown_workflow", "invalid")
    if name:
        assert name[:200].encode() not in response.content  # the refused name is not echoed
    assert not WorkflowRun.objects.exists()


def test_list_filters_and_cursor_pages(api):
    for x in range(3):
        durable.start("tests.three_steps", x=x)
    durable.start("tests.approval", queue="slow")
    drain()
    page = api.get(f"{API}workflows/?page_size=2").json()
    assert len(page["results"]) == 2 and page["next"] and "input" not in page["results"][0]
    rest = api.get(page["next"]).json()
    assert len(rest["results"]) == 2 and rest["next"] is None
    assert len(api.get(f"{API}workflows/?status=completed").json()["results"]) == 3
    assert len(api.get(f"{API}workflows/?status=waiting,completed").json()["results"]) == 4
    assert len(api.get(f"{API}workflows/?queue=slow").json()["results"]) == 1
    assert len(api.get(f"{API}workflows/?workflow=tests.approval").json()["results"]) == 1
    assert len(api.get(f"{API}workflows/?created_after=2000-01-01T00:00:00Z").json()["results"]) == 4
    assert api.get(f"{API}workflows/?created_before=2000-01-01T00:00:00%2B00:00").json()["results"] == []
    assert api.get(f"{API}workflows/?status=nope").status_code == 400
    assert api.get(f"{API}workflows/?created_after=yesterday").status_code == 400
    assert api.get(f"{API}workflows/?cursor=garbage").status_code == 400
    assert api.get(f"{API}workflows/?page_size=0").status_code == 400
    everything, url = [], f"{API}workflows/?page_size=1"
    while url:  # one run a page: every run once, newest first
        page = api.get(url).json()
        everything += [run["id"] for run in page["results"]]
        url = page["next"]
    assert everything == [str(pk) for pk in WorkflowRun.objects.order_by("-created_at", "-id").values_list("pk", flat=True)]


def test_cancel_is_idempotent_and_a_finished_run_is_a_conflict(api):
    run = durable.start("tests.approval")
    done = durable.start("tests.three_steps")
    drain()
    first = api.delete(f"{API}workflows/{run.pk}/?reason=changed+my+mind")
    assert first.status_code == 202 and first.json()["status"] == "cancelled"
    again = api.delete(f"{API}workflows/{run.pk}/")
    assert again.status_code == 202 and again.json()["status"] == "cancelled"
    conflict = api.delete(f"{API}workflows/{done.pk}/")
    assert conflict.status_code == 409 and error_code(conflict) == "run_finished"
    assert conflict.json()["error"]["message"] == "The run already ended completed."
    event = WorkflowEvent.objects.get(run=run)
    assert (event.type, event.message) == ("cancelled", "changed my mind")


def test_signal_event_result_and_retry(api, tmp_path):
    run = durable.start("tests.approval")
    waiter = durable.start("tests.payment_waiter", 7)
    drain()
    sent = api.post(f"{API}workflows/{run.pk}/signals/approved/", {"payload": {"by": "ann"}}, format="json")
    assert sent.status_code == 202 and sent.json()["name"] == "approved"
    emitted = api.post(f"{API}events/payment.settled/", {"payload": {"order": {"id": 7}, "amount": 30}}, format="json")
    assert emitted.status_code == 202 and emitted.json() == {"name": "payment.settled", "delivered": 1}
    pending = api.get(f"{API}workflows/{run.pk}/result/")
    assert pending.status_code == 202 and pending.json()["status"] == "waiting"
    drain()
    done = api.get(f"{API}workflows/{run.pk}/result/?wait=5")
    assert done.status_code == 200 and done.json()["result"] == {"by": "ann"}
    assert api.get(f"{API}workflows/{waiter.pk}/result/").json()["result"] == 30
    assert api.get(f"{API}workflows/{run.pk}/result/?wait=soon").status_code == 400
    finished = api.post(f"{API}workflows/{run.pk}/signals/approved/", {}, format="json")
    assert finished.status_code == 409 and error_code(finished) == "run_finished"

    flag = tmp_path / "broken"
    flag.touch()
    flaky = durable.start("tests.flaky_middle", str(flag))
    drain()
    flag.unlink()
    retried = api.post(f"{API}workflows/{flaky.pk}/retry/")
    assert retried.status_code == 202 and retried.json()["status"] == "pending"
    drain()
    assert api.get(f"{API}workflows/{flaky.pk}/").json()["result"] == ["a", "b", "c"]
    refused = api.post(f"{API}workflows/{flaky.pk}/retry/")
    assert refused.status_code == 409 and error_code(refused) == "invalid_transition"


def test_a_long_poll_holds_no_database_connection_while_it_waits(api, monkeypatch):
    from django_durable.api import views

    run = durable.start("tests.approval")
    drain()
    held = []
    real_sleep = views.time.sleep

    def watching_sleep(seconds):
        held.append(connections["default"].connection is not None)
        real_sleep(seconds)

    monkeypatch.setattr(views.time, "sleep", watching_sleep)
    response = api.get(f"{API}workflows/{run.pk}/result/?wait=0.4")
    assert response.status_code == 202
    assert len(held) >= 3 and not any(held)


def test_the_wait_is_bounded(api, settings, monkeypatch):
    import time

    settings.DURABLE_API_MAX_WAIT = 0.3
    run = durable.start("tests.approval")
    started = time.monotonic()
    assert api.get(f"{API}workflows/{run.pk}/result/?wait=3600").status_code == 202
    assert time.monotonic() - started < 60  # (held for the hour asked, it would take 3,600 s)


def test_schedules(api):
    schedules.ensure_schedule("hourly", "tests.tick", cron="0 * * * *")
    listed = api.get(f"{API}schedules/").json()
    assert [s["slug"] for s in listed] == ["hourly"] and listed[0]["description"] == "every hour at minute 0"
    assert api.post(f"{API}schedules/hourly/pause/").json()["status"] == "paused"
    assert api.post(f"{API}schedules/hourly/resume/").json()["status"] == "active"
    triggered = api.post(f"{API}schedules/hourly/trigger/")
    assert triggered.status_code == 202 and triggered.json()["workflow"] == "tests.tick"
    assert Schedule.objects.get().last_run_id is not None
    assert api.post(f"{API}schedules/nope/pause/").status_code == 404


# -- payloads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [2000])
def test_oversized_and_too_deep_payloads_are_refused_before_any_write(api, settings, limit):
    settings.DURABLE_MAX_PAYLOAD_BYTES = limit
    run = durable.start("tests.approval")
    huge = api.post(f"{API}workflows/", {"workflow": "tests.three_steps", "args": ["x" * (limit + 70_000)]},
                    format="json")
    assert huge.status_code == 413 and error_code(huge) == "payload_too_large"
    over = api.post(f"{API}workflows/", {"workflow": "tests.three_steps", "args": ["x" * (limit + 10)]}, format="json")
    assert over.status_code == 413
    signal = api.post(f"{API}workflows/{run.pk}/signals/go/", {"payload": "x" * (limit + 10)}, format="json")
    assert signal.status_code == 413
    deep = api.post(f"{API}workflows/", "[" * 20_000 + "]" * 20_000, content_type="application/json")
    assert deep.status_code == 400 and error_code(deep) == "invalid_json"
    nested = json.dumps({"workflow": "tests.three_steps", "args": [json.loads("[" * 150 + "]" * 150)]})
    too_deep = api.post(f"{API}workflows/", nested, content_type="application/json")
    assert too_deep.status_code == 400 and error_code(too_deep) == "invalid_payload"
    broken = api.post(f"{API}workflows/", '{"workflow": ', content_type="application/json")
    assert broken.status_code == 400 and error_code(broken) == "invalid_json"
    nan = api.post(f"{API}workflows/", '{"workflow": "tests.three_steps", "args": [NaN]}',
                   content_type="application/json")
    assert nan.status_code == 400
    assert WorkflowRun.objects.count() == 1 and not durable.get_run(run.pk).signals.exists()


def test_t32_sizes_with_the_default_limit(api):
    """RELIABILITY T32's sizes: a 10 MB body, a 100,000-deep list; then 100,000 keys, which fit."""
    ten_mb = json.dumps({"workflow": "tests.three_steps", "args": ["x" * 10_000_000]})
    assert api.post(f"{API}workflows/", ten_mb, content_type="application/json").status_code == 413
    deep = '{"workflow": "tests.three_steps", "args": [' + "[" * 100_000 + "]" * 100_000 + "]}"
    assert error_code(api.post(f"{API}workflows/", deep, content_type="application/json")) == "invalid_json"
    assert not WorkflowRun.objects.exists()
    keys = json.dumps({"workflow": "tests.three_steps", "args": [{f"k{i}": i for i in range(100_000)}]})
    assert api.post(f"{API}workflows/", keys, content_type="application/json").status_code == 201


def test_payloads_are_shown_only_with_the_payload_permission(user):
    run = durable.start("tests.raises", message=f"lookup of {SECRET} failed")
    drain()
    viewer = as_user(user("view_workflowrun"))
    for url in (f"{API}workflows/{run.pk}/", f"{API}workflows/{run.pk}/?include=steps",
                f"{API}workflows/{run.pk}/result/", f"{API}workflows/"):
        response = viewer.get(url)
        assert response.status_code in (200, 202) and SECRET.encode() not in response.content, url
    body = viewer.get(f"{API}workflows/{run.pk}/").json()
    assert (body["status"], body["payload_visible"], body["input"], body["error"]) == ("failed", False, None, None)
    reader = as_user(user("view_workflowrun", "view_payload_workflowrun"))
    body = reader.get(f"{API}workflows/{run.pk}/").json()
    assert SECRET in body["input"]["kwargs"]["message"] and SECRET in body["error"]["message"]
    assert "traceback" not in body["error"] and "Traceback" not in json.dumps(body)


# -- who may call what ---------------------------------------------------------------------------


def routes(run, name="hourly"):
    return [
        ("get", f"{API}workflows/", None), ("post", f"{API}workflows/", {"workflow": "tests.three_steps"}),
        ("get", f"{API}workflows/{run.pk}/", None), ("delete", f"{API}workflows/{run.pk}/", None),
        ("post", f"{API}workflows/{run.pk}/signals/go/", {}), ("get", f"{API}workflows/{run.pk}/result/", None),
        ("post", f"{API}workflows/{run.pk}/retry/", None), ("post", f"{API}events/e/", {}),
        ("get", f"{API}schedules/", None), ("post", f"{API}schedules/{name}/pause/", None),
        ("post", f"{API}schedules/{name}/trigger/", None), ("get", f"{API}schema/", None),
    ]


def call(client, method, url, body):
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


@pytest.fixture
def target():
    schedules.ensure_schedule("hourly", "tests.tick", cron="0 * * * *")
    run = durable.start("tests.approval")
    drain()
    return run


def test_anonymous_callers_are_refused_everywhere(target, settings):
    settings.REST_FRAMEWORK = {"DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"]}
    for method, url, body in routes(target):
        response = call(APIClient(), method, url, body)
        assert response.status_code in (401, 403), (method, url)
        assert error_code(response) in ("not_authenticated", "permission_denied")
    assert WorkflowRun.objects.count() == 1 and durable.get_run(target.pk).status == "waiting"


def test_staff_without_the_action_permissions_are_refused(target, user):
    client = as_user(user())
    for method, url, body in routes(target):
        assert call(client, method, url, body).status_code == 403, (method, url)
    viewer = as_user(user("view_workflowrun", "view_schedule"))
    allowed = {("get", f"{API}workflows/"), ("get", f"{API}workflows/{target.pk}/"), ("get", f"{API}schema/"),
               ("get", f"{API}workflows/{target.pk}/result/"), ("get", f"{API}schedules/")}
    for method, url, body in routes(target):
        status = call(viewer, method, url, body).status_code
        assert (status < 400) == ((method, url) in allowed), (method, url, status)
    assert durable.get_run(target.pk).status == "waiting"


def test_users_who_are_not_staff_are_refused_by_default_even_with_permissions(target, user):
    everything = [p.codename for p in Permission.objects.filter(content_type__app_label="django_durable")]
    client = as_user(user(*everything, staff=False))
    assert client.get(f"{API}workflows/").status_code == 403
    assert client.delete(f"{API}workflows/{target.pk}/").status_code == 403


def test_the_permission_classes_are_configurable(target, user, settings):
    settings.DURABLE_API_PERMISSION_CLASSES = ["rest_framework.permissions.IsAuthenticated"]
    service = as_user(user("view_workflowrun", "cancel_workflowrun", staff=False))
    assert service.get(f"{API}workflows/{target.pk}/").status_code == 200
    assert service.delete(f"{API}workflows/{target.pk}/").status_code == 202
    assert service.post(f"{API}workflows/", {"workflow": "tests.three_steps"}, format="json").status_code == 403


def only_default_queue(request, queryset):
    return queryset.filter(queue="default")


def test_a_run_outside_the_users_scope_is_a_404(api, settings):
    settings.DURABLE_API_QUERYSET_FILTER = "tests.test_api.only_default_queue"
    hidden = durable.start("tests.approval", queue="private")
    visible = durable.start("tests.approval")
    drain()
    for method, url, body in [("get", f"{API}workflows/{hidden.pk}/", None),
                              ("delete", f"{API}workflows/{hidden.pk}/", None),
                              ("post", f"{API}workflows/{hidden.pk}/signals/go/", {}),
                              ("get", f"{API}workflows/{hidden.pk}/result/", None),
                              ("post", f"{API}workflows/{hidden.pk}/retry/", None)]:
        response = call(api, method, url, body)
        assert response.status_code == 404 and error_code(response) == "not_found", (method, url)
    assert [r["id"] for r in api.get(f"{API}workflows/").json()["results"]] == [str(visible.pk)]
    assert durable.get_run(hidden.pk).status == "waiting"


def test_a_session_delete_needs_the_csrf_token(target, admin_user):
    client = APIClient(enforce_csrf_checks=True)
    client.login(username=admin_user.username, password="password")
    refused = client.delete(f"{API}workflows/{target.pk}/")
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]["message"]
    assert durable.get_run(target.pk).status == "waiting"
    client.get("/admin/")  # any page with a form sets the CSRF cookie
    token = client.cookies["csrftoken"].value
    assert client.delete(f"{API}workflows/{target.pk}/", HTTP_X_CSRFTOKEN=token).status_code == 202


def test_a_burst_of_cancels_is_throttled(api, settings):
    runs = [durable.start("tests.approval") for _ in range(100)]
    drain()
    codes = [api.delete(f"{API}workflows/{run.pk}/").status_code for run in runs]
    assert codes[:60] == [202] * 60 and set(codes[60:]) == {429}
    response = api.delete(f"{API}workflows/{runs[-1].pk}/")
    assert error_code(response) == "throttled" and "Retry-After" in response
    assert WorkflowRun.objects.filter(status="cancelled").count() == 60


def test_starts_signals_events_and_triggers_are_throttled_too(api, settings):
    settings.DURABLE_API_THROTTLE_RATES = {"start": "3/min", "signal": "2/min", "cancel": "60/min"}
    schedules.ensure_schedule("hourly", "tests.tick", cron="0 * * * *")
    starts = [api.post(f"{API}workflows/", {"workflow": "tests.approval"}, format="json").status_code for _ in range(4)]
    assert starts == [201, 201, 201, 429]
    assert api.post(f"{API}schedules/hourly/trigger/").status_code == 429  # a trigger is a start
    run = WorkflowRun.objects.filter(workflow="tests.approval").first()
    sent = [api.post(f"{API}workflows/{run.pk}/signals/go/", {}, format="json").status_code for _ in range(2)]
    assert sent == [202, 202]
    assert api.post(f"{API}events/paid/", {}, format="json").status_code == 429  # an event is a signal
    assert api.delete(f"{API}workflows/{run.pk}/").status_code == 202  # each scope counts on its own
    assert WorkflowRun.objects.count() == 3 and run.signals.count() == 2


@pytest.mark.parametrize("bad", ["not-a-uuid", "A" * 10_000, "%00", "1%20OR%201=1", "١٢٣", "' OR '1'='1",
                                 "00000000-0000-0000-0000-00000000000g"])
def test_malformed_ids_are_a_404_without_a_query(api, bad):
    for method, suffix in (("get", "/"), ("delete", "/"), ("get", ""), ("get", "/result/"), ("post", "/retry/")):
        with CaptureQueriesContext(connection) as queries:
            response = getattr(api, method)(f"{API}workflows/{bad}{suffix}")
        assert response.status_code == 404, (bad, method, suffix)
        assert queries.captured_queries == [], (bad, method, suffix)


def test_a_method_a_route_does_not_take_is_a_405(api, user, monkeypatch):
    response = api.put(f"{API}schedules/")
    assert response.status_code == 405 and error_code(response) == "method_not_allowed"
    assert api.patch(f"{API}workflows/{uuid.uuid4()}/").status_code == 405
    assert as_user(user()).put(f"{API}schedules/").status_code == 405  # staff: told, not refused
    assert APIClient().put(f"{API}schedules/").status_code == 401  # strangers learn nothing
    # 401 asks for the first credentials a configured authenticator can take; a session alone has
    # no challenge to offer, so a stranger is refused with 403 there.
    from rest_framework.authentication import SessionAuthentication

    from django_durable.api.views import WorkflowRunViewSet

    monkeypatch.setattr(WorkflowRunViewSet, "authentication_classes", [SessionAuthentication])
    refused = APIClient().get(f"{API}workflows/")
    assert refused.status_code == 403 and "WWW-Authenticate" not in refused


def test_an_unknown_uuid_is_a_404(api):
    assert api.get(f"{API}workflows/{uuid.uuid4()}/").status_code == 404
    assert api.delete(f"{API}workflows/{uuid.uuid4()}/").status_code == 404


def test_an_unexpected_error_is_json_without_a_traceback(api, monkeypatch):
    from django_durable import services

    run = durable.start("tests.approval")

    def broken(*args, **kwargs):
        raise RuntimeError("internal detail that must not leak")

    monkeypatch.setattr(services, "cancel", broken)
    response = api.delete(f"{API}workflows/{run.pk}/")
    assert response.status_code == 500 and error_code(response) == "server_error"
    assert b"internal detail" not in response.content and b"Traceback" not in response.content


def test_nested_field_errors_are_named_by_their_path(api):
    response = api.post(f"{API}workflows/", {"workflow": "", "args": [1, {"x": 1}], "kwargs": {"when": "now"},
                                             "priority": "high"}, format="json")
    assert response.status_code == 400 and error_code(response) == "invalid"
    assert set(response.json()["error"]["fields"]) == {"workflow", "priority"}


def test_null_values_and_any_unicode_in_the_input_round_trip(api):
    """Found by the fuzz test: a null keyword argument was refused, a lone surrogate broke Postgres."""
    kwargs = {"none": None, "lone \ud9be": "\udad3 and \x00 and \u00e9"}
    body = json.dumps({"workflow": "tests.echo", "kwargs": kwargs})  # escaped: no UTF-8 for a lone surrogate
    response = api.post(f"{API}workflows/", body, content_type="application/json")
    assert response.status_code == 201, response.content
    run = WorkflowRun.objects.get(pk=response.json()["id"])
    assert run.get_input()["kwargs"] == kwargs
    assert api.get(f"{API}workflows/{run.pk}/").json()["input"]["kwargs"] == kwargs


@pytest.mark.parametrize("query", ["created_before=4609-07-21T02:25:57.61%2B18:23", "created_after=0001-01-01T00:00:00%2B01:00",
                                   "queue=a%00b", "reason=%00"])
def test_odd_query_values_are_a_400_or_an_answer_never_a_500(api, query):
    run = durable.start("tests.approval")
    for url in (f"{API}workflows/?{query}", f"{API}workflows/{run.pk}/?{query}"):
        response = api.get(url)
        assert response.status_code in (200, 400), (url, response.content)
    assert api.get(f"{API}workflows/?created_before=4609-07-21T02:25:57%2B18:23").json()["results"][0]["id"] == str(run.pk)


@pytest.mark.parametrize("cursor", ["4609-07-21T02:25:57+18:23|6a3b2c1d-0000-4000-8000-000000000000",
                                    "9999-12-31T23:59:59-23:00|6a3b2c1d-0000-4000-8000-000000000000",
                                    "2026-01-01T00:00:00|6a3b2c1d-0000-4000-8000-000000000000", "x|y", "|"])
def test_a_forged_cursor_is_a_400_or_a_page_never_a_500(api, cursor):
    durable.start("tests.approval")
    token = base64.urlsafe_b64encode(cursor.encode()).decode()
    response = api.get(f"{API}workflows/?cursor={token}")
    assert response.status_code in (200, 400), response.content


def test_a_null_character_in_a_signal_or_event_name_is_a_400(api):
    run = durable.start("tests.approval")
    assert api.post(f"{API}workflows/{run.pk}/signals/a%00b/", {}, format="json").status_code == 400
    assert api.post(f"{API}events/a%00b/", {}, format="json").status_code == 400
    assert run.signals.count() == 0


# -- the schema ----------------------------------------------------------------------------------


def test_the_schema_documents_every_route_and_validates(api):
    from drf_spectacular.validation import validate_schema

    response = api.get(f"{API}schema/?format=json")
    assert response.status_code == 200
    schema = json.loads(response.content)
    validate_schema(schema)
    assert schema["servers"] == [{"url": "/api/durable"}]
    operations = {(path, method) for path, item in schema["paths"].items() for method in item}
    assert operations == {
        ("/workflows/", "get"), ("/workflows/", "post"), ("/workflows/{id}/", "get"), ("/workflows/{id}/", "delete"),
        ("/workflows/{id}/signals/{name}/", "post"), ("/workflows/{id}/result/", "get"),
        ("/workflows/{id}/retry/", "post"), ("/events/{name}/", "post"), ("/schedules/", "get"),
        ("/schedules/{slug}/pause/", "post"), ("/schedules/{slug}/resume/", "post"),
        ("/schedules/{slug}/trigger/", "post"), ("/workflows/definitions/", "get"),
        ("/workflows/definitions/{name}/", "get"), ("/workflows/definitions/{name}/describe/", "post"),
        ("/workflows/{id}/fork/", "post"), ("/workflows/repair/", "post"), ("/workflows/{id}/updates/{name}/", "post"),
        ("/workflows/{id}/updates/{name}/{update_id}/", "get"), ("/workflows/{id}/stream/", "get"), ("/approvals/", "get"),
        ("/workflows/{id}/approvals/{key}/", "post"), ("/queues/", "get"), ("/queues/{name}/", "delete"),
        ("/queues/{name}/pause/", "post"), ("/queues/{name}/resume/", "post"), ("/queues/{name}/limits/", "put"),
    }
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            assert operation.get("description"), (path, method)
            assert {"401", "403"} <= set(operation["responses"]), (path, method)
