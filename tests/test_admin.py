"""The operator dashboard through Django's test client: every page, every action, who may do what.

RELIABILITY T39 (no payload leak) and T40 (admin permissions and actions), and the query
budgets of the lists.
"""

import datetime as dt
import re
import uuid

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_durable as durable
from django_durable import schedules
from django_durable.models import (
    Schedule,
    Step,
    Timer,
    Worker,
    WorkflowEvent,
    WorkflowRun,
    WorkItem,
)
from django_durable.testing import drain
from tests.conftest import ON_POSTGRES, ledger_counts

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/django_durable/workflowrun/"
XSS = "<script>alert('x')</script>"


def run_url(run, action=None):
    return f"{RUNS}{run.pk}/do/{action}/" if action else f"{RUNS}{run.pk}/change/"


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


@pytest.fixture
def staff(django_user_model, client):
    """Log in a staff user with exactly the given django_durable permissions."""

    def make(*codenames):
        user = django_user_model.objects.create_user(f"staff-{uuid.uuid4().hex[:6]}", password="pw", is_staff=True)
        user.user_permissions.set(Permission.objects.filter(content_type__app_label="django_durable",
                                                            codename__in=codenames))
        client.force_login(user)
        return user

    return make


@pytest.fixture
def runs(tmp_path):
    """One run in each interesting state."""
    flag = tmp_path / "broken"
    flag.touch()
    made = {
        "completed": durable.start("tests.three_steps", x=1),
        "failed": durable.start("tests.raises", message=f"secret-token {XSS}"),
        "waiting": durable.start("tests.approval", timeout=3600),
        "sleeping": durable.start("tests.sleeper", 3600),
        "branches": durable.start("tests.slow_branch"),
        "parent": durable.start("tests.waiting_parent"),
        "compensation": durable.start("tests.saga_auto", release_fails=5),
        "flaky": durable.start("tests.flaky_middle", str(flag)),
    }
    drain()
    return made


# -- every page renders, escaped ----------------------------------------------------------------


def test_every_page_renders_for_a_superuser(admin_client, runs):
    schedules.ensure_schedule("nightly-report", "tests.tick", cron="0 3 * * mon-fri", timezone="Europe/Paris")
    Worker.objects.create(name="w1", host="h", pid=1, started_at=timezone.now(), last_seen=timezone.now())
    schedule = Schedule.objects.get(slug="nightly-report")
    pages = [
        RUNS, f"{RUNS}?status=failed", f"{RUNS}?workflow=tests.raises", f"{RUNS}?queue=default",
        f"{RUNS}?has_error=yes", f"{RUNS}?has_error=no", f"{RUNS}?stuck=any", f"{RUNS}?stuck=lease",
        f"{RUNS}?stuck=idle", f"{RUNS}?created_at__year=2026", f"{RUNS}?q=tests.raises",
        f"{RUNS}?q={runs['failed'].pk}", f"{RUNS}?q={str(runs['failed'].pk)[-8:]}", f"{RUNS}?q=nothing-like-it",
        f"{RUNS}start/", "/admin/django_durable/overview/", "/admin/django_durable/schedule/",
        f"/admin/django_durable/schedule/{schedule.pk}/change/", "/admin/django_durable/schedule/add/",
        "/admin/django_durable/workitem/", "/admin/django_durable/workitem/?lease=expired",
        "/admin/django_durable/timer/", "/admin/django_durable/worker/", "/admin/django_durable/workflowevent/",
        "/admin/django_durable/", "/admin/",
    ]
    for run in runs.values():
        pages += [run_url(run), f"{run_url(run)}?full=input", f"{RUNS}{run.pk}/history/"]
        pages += [run_url(run, action) for action in
                  ("cancel", "retry", "force-fail", "retry-rollback", "skip-step", "edit-step", "signal", "wake",
                   "duplicate")]
    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, (page, response.status_code)
        assert XSS.encode() not in response.content, page


def test_payloads_and_errors_are_escaped(admin_client, runs):
    run = durable.start("tests.three_steps", x=XSS)  # the input itself carries the payload
    response = admin_client.get(run_url(run))
    assert XSS.encode() not in response.content
    assert b"&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in response.content
    failed = admin_client.get(run_url(runs["failed"]))
    assert XSS.encode() not in failed.content and b"secret-token &lt;script&gt;" in failed.content
    listing = admin_client.get(f"{RUNS}?status=failed")
    assert XSS.encode() not in listing.content and b"KeyError" in listing.content
    overview = admin_client.get("/admin/django_durable/overview/")
    assert XSS.encode() not in overview.content and b"secret-token" in overview.content


def test_the_run_page_shows_the_journal_timeline_timers_signals_children_and_history(admin_client, runs):
    durable.signal(runs["waiting"].pk, "unrelated", {"note": "buffered"}, by="zoe")
    page = admin_client.get(run_url(runs["waiting"])).content.decode()
    assert "signal:approved:0" in page and "Signal timeout" in page and "fire now" in page
    assert "unrelated" in page and "buffered" in page and "zoe" in page
    branches = admin_client.get(run_url(runs["branches"])).content.decode()
    assert '<svg class="durable-timeline"' in branches
    assert "↳ flaky" in branches and 'stroke-dasharray="4 3"' in branches  # a branch, and its back-off
    assert "url(#durable-hatch)" in branches  # the parallel group is drawn as a wait
    parent = admin_client.get(run_url(runs["parent"])).content.decode()
    assert parent.count('durable-badge durable-waiting">waiting') >= 2  # its two children
    child = WorkflowRun.objects.filter(parent=runs["parent"]).first()
    assert str(runs["parent"].pk) in admin_client.get(run_url(child)).content.decode()


def test_long_payloads_are_cut_with_a_way_to_see_all(admin_client):
    run = durable.start("tests.three_steps", x="y" * 10_000)
    cut = admin_client.get(run_url(run)).content.decode()
    assert "Show all of the input" in cut and "y" * 5000 not in cut
    assert "y" * 10_000 in admin_client.get(f"{run_url(run)}?full=input").content.decode()


# -- who may do what (T39, T40) -----------------------------------------------------------------------


def test_anonymous_users_are_sent_to_the_login_page(client, runs):
    run = runs["waiting"]
    for page in (RUNS, run_url(run), run_url(run, "cancel"), f"{RUNS}start/", "/admin/django_durable/overview/"):
        response = client.get(page)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], page
    response = client.post(run_url(run, "cancel"), {"reason": "x", "apply": "1"})
    assert response.status_code == 302 and run_of(run).status == "waiting"


def test_staff_without_permissions_see_nothing(client, staff, runs):
    staff()
    for page in (RUNS, run_url(runs["waiting"]), "/admin/django_durable/overview/", run_url(runs["waiting"], "cancel"),
                 f"{RUNS}start/"):
        assert client.get(page).status_code == 403, page


def test_view_only_staff_see_runs_without_payloads_and_cannot_act(client, staff, runs):
    staff("view_workflowrun")
    failed = client.get(run_url(runs["failed"]))
    assert failed.status_code == 200
    assert b"secret-token" not in failed.content and b"KeyError" in failed.content  # the type, not the message
    listing = client.get(RUNS)
    assert listing.status_code == 200 and b"secret-token" not in listing.content
    assert b'value="cancel_runs"' not in listing.content and b"Start a run" not in listing.content
    assert b"secret-token" not in client.get("/admin/django_durable/overview/").content
    for action in ("cancel", "retry", "force-fail", "skip-step", "edit-step", "signal", "wake", "duplicate"):
        assert client.get(run_url(runs["waiting"], action)).status_code == 403, action
        assert client.post(run_url(runs["waiting"], action), {"apply": "1"}).status_code == 403, action
    response = client.post(RUNS, {"action": "cancel_runs", "_selected_action": [runs["waiting"].pk], "apply": "1"})
    assert run_of(runs["waiting"]).status == "waiting"
    assert client.get(f"{RUNS}start/").status_code == 403
    assert client.get(f"{RUNS}add/").status_code == 403
    assert client.post(run_url(runs["waiting"]), {"status": "completed"}).status_code in (200, 403)
    assert run_of(runs["waiting"]).status == "waiting"  # the detail page has no form to post
    del response


def test_payload_permission_shows_payloads(client, staff, runs):
    staff("view_workflowrun", "view_payload_workflowrun")
    assert b"secret-token" in client.get(run_url(runs["failed"])).content


def test_staff_with_cancel_permission_cancel_through_the_confirmation_page(client, staff, runs):
    user = staff("view_workflowrun", "cancel_workflowrun")
    run = runs["waiting"]
    page = client.get(run_url(run))
    assert b">Cancel</a>" in page.content and b">Force fail</a>" not in page.content
    confirm = client.get(run_url(run, "cancel"))
    assert confirm.status_code == 200 and b'name="reason"' in confirm.content
    assert run_of(run).status == "waiting"  # showing the page changed nothing
    response = client.post(run_url(run, "cancel"), {"reason": "duplicate order", "apply": "Cancel"}, follow=True)
    assert b"Cancel requested: duplicate order" in response.content
    run = run_of(run)
    assert run.status == "cancelled" and run.get_error()["message"] == "duplicate order"
    event = WorkflowEvent.objects.get(run=run)
    assert (event.type, event.actor, event.message) == ("cancelled", user.username, "duplicate order")
    log = LogEntry.objects.get(object_id=str(run.pk))
    assert log.user == user and "Cancel requested" in log.get_change_message()
    assert client.get(run_url(run, "force-fail")).status_code == 403


def test_bulk_cancel_confirms_then_reports_done_and_skipped(admin_client, runs):
    selected = [runs["waiting"].pk, runs["sleeping"].pk, runs["completed"].pk]
    confirm = admin_client.post(RUNS, {"action": "cancel_runs", "_selected_action": selected, "index": "0"})
    assert confirm.status_code == 200 and b"3 run(s)" in confirm.content
    assert run_of(runs["waiting"]).status == "waiting"
    done = admin_client.post(RUNS, {"action": "cancel_runs", "_selected_action": selected, "reason": "cleanup",
                                    "apply": "Cancel"}, follow=True)
    assert b"Cancelled 2 run(s); 1 skipped (1 \xc3\x97 already finished)." in done.content
    assert {run_of(runs[k]).status for k in ("waiting", "sleeping")} == {"cancelled"}
    assert LogEntry.objects.filter(object_id__in=[str(pk) for pk in selected]).count() == 2


def test_bulk_retry_wake_and_duplicate_need_no_confirmation(admin_client, runs, tmp_path):
    (tmp_path / "broken").unlink()
    response = admin_client.post(RUNS, {"action": "retry_runs", "_selected_action": [runs["flaky"].pk], "index": "0"},
                                 follow=True)
    assert b"Retried 1 run(s); 0 skipped." in response.content
    response = admin_client.post(RUNS, {"action": "wake_runs", "index": "0",
                                        "_selected_action": [runs["sleeping"].pk, runs["completed"].pk]}, follow=True)
    assert b"Woke 1 run(s); 1 skipped" in response.content
    response = admin_client.post(RUNS, {"action": "duplicate_runs", "_selected_action": [runs["completed"].pk],
                                        "index": "0"}, follow=True)
    assert b"Duplicated 1 run(s)" in response.content
    drain()
    assert run_of(runs["flaky"]).status == "completed" and run_of(runs["sleeping"]).status == "completed"
    assert WorkflowRun.objects.filter(workflow="tests.three_steps", status="completed").count() == 2


def test_each_run_action_goes_through_its_service(admin_client, runs, tmp_path):
    post = admin_client.post
    # Retry from the last checkpoint.
    (tmp_path / "broken").unlink()
    assert post(run_url(runs["flaky"], "retry"), {"apply": "1"}).status_code == 302
    drain()
    assert run_of(runs["flaky"]).status == "completed" and ledger_counts(runs["flaky"].pk)["a"] == 1
    # Force fail.
    post(run_url(runs["sleeping"], "force-fail"), {"reason": "vendor gone", "apply": "1"})
    assert run_of(runs["sleeping"]).get_error()["message"] == "vendor gone"
    # Skip a step, with a JSON result.
    post(run_url(runs["branches"], "skip-step"), {"key": "flaky", "result": '"by hand"', "apply": "1"})
    drain()
    assert run_of(runs["branches"]).get_result() == ["ok", "by hand"]
    # Edit a step's result.
    run = durable.start("tests.edited")
    drain()
    assert b"1" in admin_client.get(run_url(run, "edit-step") + "?key=a").content
    post(run_url(run, "edit-step"), {"key": "a", "result": "99", "apply": "1"})
    # Send a signal, with a JSON payload.
    post(run_url(run, "signal"), {"name": "go", "payload": '{"ok": true}', "apply": "1"})
    drain()
    assert run_of(run).get_result() == 99
    # Wake now: one timer, named.
    timer = Timer.objects.get(run=runs["waiting"], status="pending")
    post(run_url(runs["waiting"], "wake"), {"timer": timer.pk, "apply": "1"})
    drain()
    assert run_of(runs["waiting"]).get_result() == "timed out"
    # Retry the rollback.
    assert run_of(runs["compensation"]).status == "compensation_failed"
    post(run_url(runs["compensation"], "retry-rollback"), {"apply": "1"})
    assert run_of(runs["compensation"]).status == "pending"
    # Duplicate: redirects to the new run.
    response = post(run_url(runs["completed"], "duplicate"), {"apply": "1"})
    copy = WorkflowRun.objects.exclude(pk=runs["completed"].pk).filter(workflow="tests.three_steps").get()
    assert response["Location"] == run_url(copy)
    kinds = set(WorkflowEvent.objects.values_list("type", flat=True))
    assert kinds >= {"retried", "force_failed", "step_skipped", "step_edited", "signal_sent", "woken",
                     "rollback_retried", "duplicated"}
    assert set(WorkflowEvent.objects.exclude(type="attempt_ended").values_list("actor", flat=True)) == {"admin"}
    assert LogEntry.objects.count() >= 8


def test_an_action_the_run_state_refuses_is_shown_on_the_form(admin_client, runs):
    response = admin_client.post(run_url(runs["completed"], "cancel"), {"reason": "", "apply": "1"})
    assert response.status_code == 200 and b"already ended completed" in response.content
    response = admin_client.post(run_url(runs["waiting"], "signal"), {"name": "x", "payload": "{not json",
                                                                     "apply": "1"})
    assert response.status_code == 200 and b"not valid JSON" in response.content
    assert not WorkflowEvent.objects.exists()


def test_a_run_whose_input_holds_a_lone_surrogate_renders(admin_client):
    run = durable.start("tests.three_steps", x="a\udc80")
    page = admin_client.get(f"{RUNS}{run.pk}/change/")
    assert page.status_code == 200 and b"\\udc80" in page.content


def test_malformed_and_unknown_ids_are_404(admin_client):
    for bad in ("not-a-uuid", "A" * 300, "1%20OR%201=1", str(uuid.uuid4())):
        assert admin_client.get(f"{RUNS}{bad}/change/").status_code == 404, bad
        assert admin_client.get(f"{RUNS}{bad}/do/cancel/").status_code == 404, bad
    assert admin_client.get(f"{RUNS}{uuid.uuid4()}/do/no-such-action/").status_code == 404


# -- starting runs from the admin ----------------------------------------------------------------------


def test_start_a_run_from_the_admin(admin_client):
    page = admin_client.get(f"{RUNS}start/")
    assert b'<option value="tests.three_steps">' in page.content
    response = admin_client.post(f"{RUNS}start/", {"workflow": "tests.three_steps", "args": "[]",
                                                   "kwargs": '{"x": 4}', "apply": "Start"})
    run = WorkflowRun.objects.get()
    assert response["Location"] == run_url(run)
    drain()
    assert run_of(run).get_result() == [4, 5, 6]
    assert WorkflowEvent.objects.get(run=run).actor == "admin"
    assert LogEntry.objects.get(object_id=str(run.pk)).is_addition()


@pytest.mark.parametrize("name", ["unregistered", "os.system", "django.core.management.call_command", "../x",
                                  "x" * 10_000, "", "tests.three_steps\u200b", "tеsts.three_steps"])
def test_start_refuses_names_that_are_not_registered_workflows(admin_client, monkeypatch, name):
    import importlib

    def no_import(*args, **kwargs):
        raise AssertionError("nothing may be imported from a workflow name")

    monkeypatch.setattr(importlib, "import_module", no_import)
    response = admin_client.post(f"{RUNS}start/", {"workflow": name, "args": "[]", "kwargs": "{}", "apply": "Start"})
    assert response.status_code == 200
    assert b"Select a registered workflow." in response.content or b"This field is required" in response.content
    assert name[:100].encode() not in response.content or not name  # the refused name is not echoed
    assert not WorkflowRun.objects.exists()


def test_start_validates_the_arguments(admin_client):
    for args, kwargs, message in (("{}", "{}", b"Enter a JSON list"), ("[]", "[1]", b"Enter a JSON object"),
                                  ("[", "{}", b"not valid JSON")):
        response = admin_client.post(f"{RUNS}start/", {"workflow": "tests.three_steps", "args": args,
                                                       "kwargs": kwargs, "apply": "Start"})
        assert message in response.content
    response = admin_client.post(f"{RUNS}start/", {"workflow": "tests.three_steps", "args": "[]",
                                                   "kwargs": '{"nope": 1}', "apply": "Start", "delay": "-1"})
    assert b"greater than or equal to 0" in response.content
    assert not WorkflowRun.objects.exists()


# -- read-only, and delete only what finished (T40) ----------------------------------------------------


def test_runs_are_read_only_and_only_finished_ones_are_deleted(admin_client, runs):
    assert admin_client.get(f"{RUNS}add/").status_code == 403
    assert admin_client.get(f"{RUNS}{runs['waiting'].pk}/delete/").status_code == 403
    assert admin_client.post(f"{RUNS}{runs['completed'].pk}/delete/", {"post": "yes"}).status_code == 302
    assert not WorkflowRun.objects.filter(pk=runs["completed"].pk).exists()
    listing = admin_client.get(RUNS).content
    assert b'value="delete_selected"' not in listing and b'value="delete_finished_runs"' in listing
    selected = [runs["failed"].pk, runs["waiting"].pk]
    admin_client.post(RUNS, {"action": "delete_finished_runs", "_selected_action": selected, "index": "0"})
    response = admin_client.post(RUNS, {"action": "delete_finished_runs", "_selected_action": selected, "apply": "1"},
                                 follow=True)
    assert b"Deleted 1 run(s); 1 skipped (unfinished)." in response.content
    assert WorkflowRun.objects.filter(pk=runs["waiting"].pk).exists()
    assert not WorkflowRun.objects.filter(pk=runs["failed"].pk).exists()
    # Their work items and journal went with them (no constraint in the database asks for it).
    deleted = [runs["completed"].pk, runs["failed"].pk]
    assert not WorkItem.objects.filter(run_id__in=deleted).exists()
    assert not Step.objects.filter(run_id__in=deleted).exists()


def test_work_items_timers_and_events_are_read_only(admin_client, runs):
    item = WorkItem.objects.first()
    page = admin_client.get(f"/admin/django_durable/workitem/{item.pk}/change/")
    assert page.status_code == 200 and b'name="status"' not in page.content
    assert admin_client.get(f"/admin/django_durable/workitem/{item.pk}/delete/").status_code == 403
    assert admin_client.get("/admin/django_durable/workitem/add/").status_code == 403
    timer = Timer.objects.first()
    assert admin_client.get(f"/admin/django_durable/timer/{timer.pk}/delete/").status_code == 403


# -- the other pages ------------------------------------------------------------------------------


def test_release_a_stuck_claim_from_the_work_items_page(admin_client, staff, client):
    from django_durable import workpool

    run = durable.start("tests.three_steps")
    claim = workpool.claim(worker="hung-worker", queues=None, db="default")
    items = "/admin/django_durable/workitem/"
    confirm = admin_client.post(items, {"action": "release_claims", "_selected_action": [claim.item_id], "index": "0"})
    assert b"hung-worker" in confirm.content
    done = admin_client.post(items, {"action": "release_claims", "_selected_action": [claim.item_id], "apply": "1"},
                             follow=True)
    assert b"Released 1 claim(s); 0 skipped" in done.content
    assert WorkItem.objects.get(pk=claim.item_id).status == "pending"
    assert WorkflowEvent.objects.get(run=run).type == "claim_released"
    staff("view_workitem")
    assert b'value="release_claims"' not in client.get(items).content


def test_schedules_are_validated_described_and_steered(admin_client):
    add = "/admin/django_durable/schedule/add/"
    form = {"slug": "reports", "workflow": "tests.tick", "cron": "61 * * * *", "timezone": "UTC", "args": "[]",
            "kwargs": "{}", "overlap": "allow", "catch_up": "none", "queue": "", "status": "active"}
    response = admin_client.post(add, form)
    assert response.status_code == 200 and b"not a valid five-field cron expression" in response.content
    assert admin_client.post(add, dict(form, timezone="Mars/Olympus")).status_code == 200
    assert not Schedule.objects.exists()
    response = admin_client.post(add, dict(form, cron="30 9 * * mon-fri", timezone="Europe/Paris"))
    assert response.status_code == 302
    schedule = Schedule.objects.get(slug="reports")
    assert schedule.next_fire_at is not None
    page = admin_client.get(f"/admin/django_durable/schedule/{schedule.pk}/change/").content.decode()
    assert "at 09:30 on Monday to Friday" in page and page.count("<li>") >= 5
    listing = "/admin/django_durable/schedule/"
    admin_client.post(listing, {"action": "pause", "_selected_action": [schedule.pk], "index": "0"})
    assert Schedule.objects.get(pk=schedule.pk).status == "paused"
    admin_client.post(listing, {"action": "resume", "_selected_action": [schedule.pk], "index": "0"})
    assert Schedule.objects.get(pk=schedule.pk).status == "active"
    admin_client.post(listing, {"action": "run_now", "_selected_action": [schedule.pk], "index": "0"})
    run = Schedule.objects.get(pk=schedule.pk).last_run
    assert run is not None and run.workflow == "tests.tick"
    assert f"/admin/django_durable/workflowrun/{run.pk}/change/" in admin_client.get(listing).content.decode()


def test_a_declared_schedule_only_has_its_status_edited(admin_client):
    schedules.sync_declared()
    schedule = Schedule.objects.get(slug="tests.nightly")
    url = f"/admin/django_durable/schedule/{schedule.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert 'name="cron"' not in page and 'name="status"' in page
    assert admin_client.post(url, {"status": "paused"}).status_code == 302
    schedule.refresh_from_db()
    assert (schedule.status, schedule.cron) == ("paused", "0 3 * * *")
    assert admin_client.get(f"/admin/django_durable/schedule/{schedule.pk}/delete/").status_code == 403


def test_the_banner_warns_when_no_worker_is_live(admin_client):
    pages = [RUNS, "/admin/django_durable/overview/", "/admin/django_durable/schedule/",
             "/admin/django_durable/workitem/", f"{RUNS}start/"]
    for page in pages:
        assert b"No worker has reported yet" in admin_client.get(page).content, page
    worker = Worker.objects.create(name="w", host="h", pid=1, started_at=timezone.now(), last_seen=timezone.now())
    for page in pages:
        assert b'class="durable-banner"' not in admin_client.get(page).content, page
    Worker.objects.filter(pk=worker.pk).update(last_seen=timezone.now() - timezone.timedelta(minutes=5))
    assert b"No worker has been seen for 5 min" in admin_client.get(RUNS).content
    workers = admin_client.get("/admin/django_durable/worker/").content
    assert b"stale" in workers


# -- query budgets ---------------------------------------------------------------------------------


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


def test_the_run_list_costs_the_same_queries_for_5_or_60_runs(admin_client):
    for x in range(5):
        durable.start("tests.approval", timeout=3600)
    drain()
    few = count_queries(admin_client, RUNS)
    for x in range(55):
        durable.start("tests.approval", timeout=3600)
    drain()
    many = count_queries(admin_client, RUNS)
    assert many == few <= 12
    assert count_queries(admin_client, f"{RUNS}?stuck=any") <= few


def test_the_run_list_says_what_the_next_timer_is_for(admin_client):
    """A wait's timeout is not a wake-up: "times out in …", a sleep "wakes in …"."""
    waiting = durable.start("tests.approval", timeout=3600)
    sleeping = durable.start("tests.sleeper", 3600)
    drain()
    page = admin_client.get(RUNS).content.decode()
    rows = {pk: page[page.index(f"/{pk}/change/"):][:3000] for pk in (waiting.pk, sleeping.pk)}
    assert "times out in" in rows[waiting.pk] and "wakes in" not in rows[waiting.pk].split("</tr>")[0]
    assert "wakes in" in rows[sleeping.pk].split("</tr>")[0]


def test_the_overview_and_a_run_page_cost_a_fixed_number_of_queries(admin_client):
    few = durable.start("tests.squares", 2)
    many = durable.start("tests.squares", 40)
    drain()
    assert count_queries(admin_client, run_url(few)) == count_queries(admin_client, run_url(many)) <= 16
    count_queries(admin_client, "/admin/django_durable/overview/")  # the day's whole hours counted, then cached
    before = count_queries(admin_client, "/admin/django_durable/overview/")
    for x in range(20):
        durable.start("tests.raises")
    drain()
    # At most 15 (one of them the queues steered at runtime), and on PostgreSQL one more: who holds
    # VACUUM's horizon back (django_durable.horizon).
    assert count_queries(admin_client, "/admin/django_durable/overview/") == before <= (16 if ON_POSTGRES else 15)


def test_the_overview_counts_a_past_hour_once_and_then_reads_it_from_the_cache():
    from django.core.cache import cache

    from django_durable import stats

    cache.clear()
    try:
        runs = [durable.start("tests.raises") for _ in range(3)] + [durable.start("tests.three_steps")]
        drain()
        now = timezone.now()
        three_hours_ago = (now - dt.timedelta(hours=3)).replace(minute=30)
        WorkflowRun.objects.filter(pk__in=[r.pk for r in runs[:3]]).update(finished_at=three_hours_ago)
        hour = three_hours_ago.replace(minute=0, second=0, microsecond=0)
        assert stats.finished_by_hour(now)[hour] == {("default", "failed"): 3}
        WorkflowRun.objects.filter(pk=runs[0].pk).delete()  # a past hour's count is not read again
        assert stats.finished_by_hour(now)[hour] == {("default", "failed"): 3}
        assert sum(n for h in stats.finished_by_hour(now).values() for n in h.values()) == 4
    finally:
        cache.clear()  # the counts of a backdated hour must not reach other tests


def test_the_list_never_counts_the_whole_table(admin_client, monkeypatch):
    from django_durable.admin import base

    monkeypatch.setattr(base, "LIST_COUNT_CAP", 3)
    for x in range(5):
        durable.start("tests.three_steps")
    page = admin_client.get(RUNS).content.decode()
    assert "More than 3 workflow runs" in page


def test_the_stuck_filter_finds_expired_leases_and_runs_nothing_will_advance(admin_client):
    from django_durable import workpool

    waiting_for_signal = durable.start("tests.approval")
    sleeping = durable.start("tests.sleeper", 3600)
    orphan = durable.start("tests.sleeper", 3600)
    drain()
    Timer.objects.filter(run=orphan).update(status="cancelled")  # nothing will ever wake it
    lost = durable.start("tests.three_steps")
    claim = workpool.claim(worker="gone", queues=None, db="default")
    assert claim.run_id == lost.pk
    WorkItem.objects.filter(pk=claim.item_id).update(claim_expires_at=timezone.now() - timezone.timedelta(minutes=1))

    def listed(query):
        page = admin_client.get(f"{RUNS}?{query}").content.decode()
        return {run.pk for run in (waiting_for_signal, sleeping, orphan, lost) if str(run.pk) in page}

    assert listed("stuck=any") == {orphan.pk, lost.pk}
    assert listed("stuck=lease") == {lost.pk}
    assert listed("stuck=idle") == {orphan.pk}


def test_a_search_by_the_end_of_a_runs_id_finds_it(admin_client, runs):
    """The short id the list shows (its last 8 hex digits), or up to 12: on PostgreSQL through the
    index of the ids read backwards."""
    target = runs["failed"]
    for tail in (str(target.pk)[-8:], str(target.pk).replace("-", "")[-12:]):
        page = admin_client.get(RUNS, {"q": tail}).content.decode()
        listed = set(re.findall(r'/workflowrun/([0-9a-f-]{36})/change/', page))
        assert listed == {str(target.pk)}, (tail, listed)
    if ON_POSTGRES:
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan TO off")
            cursor.execute("EXPLAIN SELECT id FROM durable_workflow_run WHERE reverse(id::text) LIKE 'abc%'")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("RESET enable_seqscan")
        assert "durable_run_id_reversed" in plan, plan


@pytest.mark.postgres
@pytest.mark.parametrize(("query", "index"), [
    ("", "durable_run_created"),
    ("status__exact=failed", "durable_run_status_created"),
    ("workflow=tests.flow_3", "durable_run_workflow_created"),
    ("created_at__gte={day}", "durable_run_created"),
])
def test_the_run_list_reads_its_page_from_an_index_in_order(admin_client, query, index):
    """Newest first, as the list shows runs, is its index read backwards: a page reads its 100 rows
    and stops, where a sort would read every run that matches first (whatever the table holds)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, attempt, max_attempts,
                queue, priority, created_at, updated_at)
            SELECT gen_random_uuid(), 'tests.flow_' || (i % 7), CASE WHEN i % 50 = 0 THEN 'failed' ELSE 'completed' END,
                '', '{"args":[],"kwargs":{}}', 1, 1, 'default', 0, created, created
            FROM (SELECT i, now() - i * interval '1 minute' AS created FROM generate_series(1, 20000) AS i) AS made
            """)
        cursor.execute("ANALYZE durable_workflow_run")
    day = (timezone.now() - dt.timedelta(days=3)).strftime("%Y-%m-%dT00:00:00%%2B00:00")
    with CaptureQueriesContext(connection) as captured:
        assert admin_client.get(f"{RUNS}?{query.format(day=day)}").status_code == 200
    listed = [q["sql"] for q in captured.captured_queries
              if 'FROM "durable_workflow_run"' in q["sql"] and "ORDER BY" in q["sql"] and "LIMIT" in q["sql"]]
    assert len(listed) == 1, [q["sql"] for q in captured.captured_queries]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + listed[0])
        plan = cursor.fetchone()[0]
    nodes, stack = [], [plan[0]["Plan"]]
    while stack:
        nodes.append(stack.pop())
        stack.extend(nodes[-1].get("Plans", []))
    shown = [(node["Node Type"], node.get("Index Name"), node.get("Scan Direction")) for node in nodes]
    assert not any("Sort" in kind for kind, _, _ in shown), shown
    assert any(kind.startswith("Index") and name == index and direction == "Backward"
               for kind, name, direction in shown), shown
