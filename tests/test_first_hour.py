"""What a new user and an operator meet first (issue 12): bad input refused, values shown in one
convention, the evidence of earlier attempts kept, and workers that say what happens."""

import io
import json
import logging
from decimal import Decimal

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.testing import drain
from django_durable.models import WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

API = "/api/durable/"
RUNS = "/admin/django_durable/workflowrun/"


@pytest.fixture
def api(admin_user):
    cache.clear()  # throttles
    client = APIClient()
    client.force_authenticate(admin_user)
    yield client
    cache.clear()


def fields(response) -> dict:
    return response.json()["error"]["fields"]


# -- 1. bad input is refused, never silently changed -------------------------------------------------


def test_a_signal_body_without_its_envelope_is_refused_and_nothing_is_delivered(api):
    run = durable.start("tests.approval")
    bare = api.post(f"{API}workflows/{run.pk}/signals/approved/", {"approved": False}, format="json")
    assert bare.status_code == 400, bare.content
    assert bare.json()["error"]["code"] == "unknown_field"
    assert "payload" in fields(bare)["approved"][0]
    assert not run.signals.exists()
    mixed = api.post(f"{API}workflows/{run.pk}/signals/approved/",
                     {"payload": 1, "idempotency_key": "k", "idempotencykey": "k"}, format="json")
    assert mixed.status_code == 400 and list(fields(mixed)) == ["idempotencykey"]
    sent = api.post(f"{API}workflows/{run.pk}/signals/approved/", {"payload": {"approved": False}}, format="json")
    assert sent.status_code == 202
    assert json.loads(run.signals.get().payload) == {"approved": False}


def test_unknown_keys_in_every_request_body_are_named(api):
    start = api.post(f"{API}workflows/", {"workflow": "tests.three_steps", "kwarg": {"x": 1}}, format="json")
    assert start.status_code == 400 and list(fields(start)) == ["kwarg"]
    event = api.post(f"{API}events/payment.settled/", {"order": 7}, format="json")
    assert event.status_code == 400 and list(fields(event)) == ["order"]
    assert not WorkflowRun.objects.exists()


def test_the_schema_shows_the_signal_envelope_with_an_example(api):
    schema = api.get(f"{API}schema/?format=json").json()
    operation = schema["paths"]["/workflows/{id}/signals/{name}/"]["post"]
    examples = operation["requestBody"]["content"]["application/json"]["examples"]
    assert any(example["value"].get("payload") == {"approved": False, "by": "alice"} for example in examples.values())


def test_arguments_the_workflow_does_not_take_are_refused_everywhere_before_anything_is_stored(api, admin_client):
    with pytest.raises(durable.InvalidArguments, match="no argument named 'y'.*its arguments: x"):
        durable.start("tests.three_steps", y=2)
    with pytest.raises(durable.InvalidArguments, match="missing a required argument: 'seconds'"):
        durable.start("tests.sleeper")
    with pytest.raises(TypeError, match="too many positional arguments"):
        durable.start("tests.three_steps", 1, 2)

    rest = api.post(f"{API}workflows/", {"workflow": "tests.three_steps", "kwargs": {"y": 2}}, format="json")
    assert rest.status_code == 400 and rest.json()["error"]["code"] == "invalid_arguments"
    assert "'y'" in fields(rest)["kwargs.y"][0]

    page = admin_client.post(f"{RUNS}start/", {"workflow": "tests.three_steps", "args": "[]",
                                               "kwargs": '{"y": 2}', "apply": "Start"})
    assert page.status_code == 200 and b"takes no argument named" in page.content

    with pytest.raises(CommandError, match="no argument named 'y'") as cli:
        call_command("durable", "start", "tests.three_steps", "--kwargs", '{"y": 2}', stdout=io.StringIO())
    assert cli.value.returncode == 2
    assert not WorkflowRun.objects.exists()
    # What the function takes is still taken, **kwargs included.
    assert durable.start("tests.three_steps", x=2).pk


# -- 2. money stays money ----------------------------------------------------------------------------

SHOWN = {"total": "42.00", "order": "6a3b2c1d-0000-4000-8000-0000000000aa", "at": "2026-11-23T12:00:00+00:00",
         "took": "P0DT00H05M00S", "when": "2026-11-23"}


def test_every_surface_shows_decimal_uuid_and_times_as_strings_never_the_stored_form(api, admin_client):
    run = durable.start("tests.money")
    drain()
    run.refresh_from_db()
    assert run.get_result()["total"] == Decimal("42.00")  # Python keeps the types
    assert api.get(f"{API}workflows/{run.pk}/").json()["result"] == SHOWN
    journal = api.get(f"{API}workflows/{run.pk}/?include=steps").json()["journal"]
    assert journal[0]["result"] == "42.00"

    out = io.StringIO()
    call_command("durable", "status", str(run.pk), stdout=out)
    assert '"total":"42.00"' in out.getvalue()
    as_json = io.StringIO()
    call_command("durable", "status", str(run.pk), "--json", stdout=as_json)
    assert json.loads(as_json.getvalue())["result"] == SHOWN

    page = admin_client.get(f"{RUNS}{run.pk}/change/").content.decode()
    assert "42.00" in page and "P0DT00H05M00S" in page
    home = admin_client.get("/").content.decode()
    assert "42.00" in home
    for text in (out.getvalue(), as_json.getvalue(), page, home):
        assert "__durable__" not in text


def test_the_command_line_takes_the_short_id_the_admin_shows(admin_client):
    run = durable.start("tests.three_steps")
    assert run.short_id in admin_client.get(RUNS).content.decode()
    assert run.short_id in admin_client.get("/").content.decode()
    out = io.StringIO()
    call_command("durable", "status", run.short_id, stdout=out)
    assert out.getvalue().startswith(f"{run.pk} tests.three_steps")
    with pytest.raises(CommandError, match="No workflow run has an id ending in 'ffffffffff'"):
        call_command("durable", "status", "ffffffffff", stdout=io.StringIO())


# -- 3. retry keeps the evidence -------------------------------------------------------------------


def test_the_errors_of_earlier_attempts_of_a_step_and_a_branch_that_succeeded_are_kept(api):
    run = durable.start("tests.fails_twice")
    for _ in range(10):
        drain()
    run.refresh_from_db()
    assert run.status == "completed" and run.get_result() == [3, 3]
    errors = api.get(f"{API}workflows/{run.pk}/").json()["errors"]
    assert [(e["step"], e["step_attempt"], e["message"], e["current"]) for e in errors] == [
        ("step", 1, "step execution 1 fails", True), ("step", 2, "step execution 2 fails", True),
        ("branch", 1, "branch execution 1 fails", True), ("branch", 2, "branch execution 2 fails", True),
    ], errors


def test_retrying_a_failed_run_keeps_every_attempts_error_on_the_page_and_in_the_api(api, admin_client, tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    run = durable.start("tests.flaky_middle", str(flag))
    drain()
    durable.retry_run(run.pk, by="alice")  # still broken: fails again
    drain()
    flag.unlink()
    durable.retry_run(run.pk, by="alice")
    drain()
    run.refresh_from_db()
    assert run.status == "completed" and run.error is None
    errors = api.get(f"{API}workflows/{run.pk}/").json()["errors"]
    shown = [(e["attempt"], e["step"], e["step_attempt"], e["type"].rpartition(".")[2], e["current"]) for e in errors]
    assert shown == [(1, "b", 1, "NonRetryableError", False), (1, None, None, "StepFailed", False),
                     (1, "b", 1, "NonRetryableError", False), (1, None, None, "StepFailed", False)], shown
    assert all("b is broken while broken exists" in e["message"] for e in errors)
    page = admin_client.get(f"{RUNS}{run.pk}/change/").content.decode()
    assert "Errors of every attempt (4)" in page
    assert page.count("Attempt 1 ended failed: StepFailed: Step &#x27;b&#x27; failed") == 2, page



def test_retrying_a_parent_keeps_the_error_of_the_child_it_retries_with_it(api, tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    parent = durable.start("tests.flaky_parent", str(flag))
    for _ in range(3):
        drain()
    child = WorkflowRun.objects.get(parent=parent.pk)
    assert child.status == "failed"
    flag.unlink()
    durable.retry_run(parent.pk)
    for _ in range(3):
        drain()
    child.refresh_from_db()
    assert child.status == "completed" and child.error is None
    errors = api.get(f"{API}workflows/{child.pk}/").json()["errors"]
    assert [(e["step"], e["current"]) for e in errors] == [("work", False), (None, False)], errors
    assert "work is broken while broken exists" in errors[0]["message"]

# -- 4. workers say what happens -------------------------------------------------------------------


def test_failures_and_retries_are_logged_once_each_on_one_line_with_the_run_and_the_step(caplog, tmp_path):
    flag = tmp_path / "broken"
    flag.touch()
    failing = durable.start("tests.flaky_middle", str(flag))
    retried = durable.start("tests.fails_twice")
    with caplog.at_level(logging.INFO, logger="django_durable"):
        for _ in range(10):
            drain()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert all("\n" not in line for line in lines), lines
    ended = [line for line in lines if line.startswith(f"Run {failing.pk} of tests.flaky_middle ended failed:")]
    assert len(ended) == 1 and "Step 'b' failed" in ended[0] and "NonRetryableError: b is broken" in ended[0], lines
    for key in ("step", "branch"):
        for attempt in (1, 2):
            retry = f"Run {retried.pk} step {key!r}: attempt {attempt} of 3 failed (ConnectionError: {key} execution " \
                    f"{attempt} fails); retrying at once."
            assert lines.count(retry) == 1, lines
    assert not [line for line in lines if str(retried.pk) in line and "attempt 3" in line]


# -- 7. the first time right -----------------------------------------------------------------------


def test_a_wait_that_times_out_with_no_live_worker_says_so():
    from django.utils import timezone

    from django_durable.models import Worker

    run = durable.start("tests.three_steps")
    with pytest.raises(durable.WaitTimeout, match="No worker is running: start one with `python manage.py durable_worker`"):
        durable.wait(run.pk, timeout=0.05)
    Worker.objects.create(name="w", host="h", pid=1, queues="emails", started_at=timezone.now(), last_seen=timezone.now())
    with pytest.raises(durable.WaitTimeout, match="No live worker serves its queue 'default'"):
        durable.wait(run.pk, timeout=0.05)
    Worker.objects.create(name="w2", host="h", pid=2, started_at=timezone.now(), last_seen=timezone.now())
    with pytest.raises(durable.WaitTimeout) as timed_out:
        durable.wait(run.pk, timeout=0.05)
    assert "worker" not in str(timed_out.value)


NO_WORKER = "No worker is running: start one with `python manage.py durable_worker`."


def test_a_start_and_a_wait_over_http_and_the_command_line_say_no_worker_is_running(api):
    from django.utils import timezone

    from django_durable.models import Worker

    started = api.post(f"{API}workflows/", {"workflow": "tests.three_steps", "kwargs": {"x": 1}}, format="json")
    assert started.status_code == 201 and started.json()["warning"] == NO_WORKER
    waited = api.get(f"{API}workflows/{started.json()['id']}/result/?wait=0.1")
    assert waited.status_code == 202 and waited.json()["warning"] == NO_WORKER
    err = io.StringIO()
    with pytest.raises(CommandError) as timed_out:
        call_command("durable", "start", "tests.three_steps", "--kwargs", '{"x": 2}', "--wait", "0.1",
                     stdout=io.StringIO(), stderr=err)
    assert str(timed_out.value).endswith(f"did not finish within 0.1 s. {NO_WORKER}")
    assert NO_WORKER not in err.getvalue()  # said once, by the timeout
    err = io.StringIO()
    call_command("durable", "start", "tests.three_steps", "--kwargs", '{"x": 4}', stdout=io.StringIO(), stderr=err)
    assert err.getvalue() == f"warning: {NO_WORKER}\n"  # without --wait, at the start

    Worker.objects.create(name="w", host="h", pid=1, started_at=timezone.now(), last_seen=timezone.now())
    started = api.post(f"{API}workflows/", {"workflow": "tests.three_steps", "kwargs": {"x": 3}}, format="json")
    assert started.json()["warning"] is None
    assert api.get(f"{API}workflows/{started.json()['id']}/result/").json()["warning"] is None
    drain()
    assert api.get(f"{API}workflows/{started.json()['id']}/result/").json()["warning"] is None


def test_schedules_are_synced_under_one_command_name():
    from django.core.management import get_commands

    assert "durable_schedules" not in get_commands()
    out = io.StringIO()
    call_command("durable", "schedules", "sync", stdout=out)
    assert "declared schedule(s) in place" in out.getvalue()


def test_the_readme_curl_example_starts_a_run_that_completes_in_the_demo(api):
    import re

    from tests.conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    body = re.search(r"-X POST localhost:8000/api/durable/workflows/ \\\n.*-d '(\{.*\})'", readme).group(1)
    started = api.post(f"{API}workflows/", json.loads(body), format="json")
    assert started.status_code == 201, started.content
    drain()
    done = api.get(f"{API}workflows/{started.json()['id']}/result/")
    assert done.status_code == 200 and done.json()["result"] == "Hello, curl!"
    signal_body = re.search(r"signals/approved/ \\\n.*-d '(\{.*\})'", readme).group(1)
    assert list(json.loads(signal_body)) == ["payload"]


# -- 6. the admin reads right ----------------------------------------------------------------------


def test_the_admin_pages_raise_no_deprecation_warnings_of_django(admin_client, tmp_path):
    import warnings

    run = durable.start("tests.three_steps")
    durable.start("tests.approval", timeout=3600)  # the list draws what a waiting run does
    drain()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for url in (RUNS, f"{RUNS}{run.pk}/change/", "/admin/django_durable/overview/", "/admin/django_durable/workitem/",
                    "/admin/django_durable/schedule/", "/admin/django_durable/worker/"):
            assert admin_client.get(url).status_code == 200, url
    removed = [str(w.message) for w in caught if w.category.__name__.startswith("RemovedInDjango")]
    assert removed == []


def test_an_open_wait_reaches_now_and_its_deadline_is_drawn_where_it_falls():
    import re

    import datetime as dt

    from django_durable.admin import timeline
    from django_durable.models import Step

    for timeout, far in ((2, False), (3600, True)):
        run = durable.start("tests.approval", timeout=timeout)
        drain()
        run.refresh_from_db()
        steps = list(Step.objects.filter(run=run).order_by("seq"))
        wait = next(step for step in steps if step.status == "waiting")
        # Drawn 1.5 s into the wait: a 2 s deadline is near, one of an hour is far.
        svg = str(timeline.render(run, steps, now=wait.started_at + dt.timedelta(seconds=1.5)))
        bar = next(match for match in re.finditer(
            r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*><title>([^<]*)</title>', svg)
            if match[3].startswith(wait.key + ":"))
        right = float(bar[1]) + float(bar[2])
        if far:  # the axis ends now: the wait reaches the end, an arrow says how far its deadline is
            assert abs(right - (timeline.WIDTH - timeline.RIGHT)) < 1, (right, svg)
            assert 'class="deadline-ahead"' in svg and "→ 59 min 58 s" in svg
        else:  # the axis stretches to the deadline, which is drawn after now, not clamped to it
            deadline = float(re.search(r'<line x1="([\d.]+)"[^>]*class="deadline"', svg)[1])
            assert deadline > right + 5, (deadline, right)
            assert abs(deadline - (timeline.WIDTH - timeline.RIGHT)) < 1


def test_a_finished_run_shows_no_waits_or_skips_and_deliveries_read_the_same_everywhere(admin_client):
    run = durable.start("tests.approval", timeout=3600)
    drain()
    def steps_table():
        page = admin_client.get(f"{RUNS}{run.pk}/change/").content.decode()
        start = page.index('id="durable-steps"')
        return page[start:page.index("</table>", start)]

    assert ">until " in steps_table() and "skip-step" in steps_table()  # unfinished: the wait's deadline, and skip
    durable.cancel(run.pk)
    drain()
    assert ">until " not in steps_table() and "skip-step" not in steps_table()
    assert '>stopped</span>' in steps_table()

    from django_durable.models import WorkItem

    assert not WorkItem.objects.filter(run=run).exists()  # its end deleted its item
    held = durable.start("tests.three_steps", x=1)  # a run a worker holds, on its second delivery
    WorkItem.objects.filter(run=held).update(status="processing", attempts=2, claimed_by="w:1")
    page = admin_client.get(f"{RUNS}{held.pk}/change/").content.decode()
    listing = admin_client.get("/admin/django_durable/workitem/").content.decode()
    assert "<td>2 of 5</td>" in page and "2 of 5" in listing
    assert "column-delivery" in listing and ">deliveries<" not in page
