"""The small things users hit: start_and_wait's run, ensure_schedule and a paused schedule, the previous
attempt's error in a step, the kind of wait as a filter, a fan-out's count kept current."""

import pytest
from rest_framework.test import APIClient

import django_durable as durable
from django_durable import schedules
from django_durable.models import Schedule, WorkflowRun, WorkItem
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

seen_errors: list = []


def flaky(times):
    step = durable.current_step()
    seen_errors.append(step.previous_error)
    if step.attempt <= times:
        raise ConnectionError(f"refused on attempt {step.attempt}")
    return step.attempt


@durable.workflow("tests.small.flaky")
def flaky_run(ctx, times):
    return ctx.step("call", flaky, times, retry=durable.RetryPolicy(max_attempts=3, initial_backoff=0.001, jitter=0))


def test_a_retried_step_sees_the_previous_attempts_error():
    seen_errors.clear()
    run = durable.start(flaky_run, 2)
    for _ in range(20):
        if not drain():
            break
        WorkItem.objects.filter(status="pending").update(available_at="2000-01-01T00:00:00Z")
        from django_durable.models import Timer
        Timer.objects.filter(status="pending").update(fire_at="2000-01-01T00:00:00Z")
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == 3
    assert seen_errors[0] is None
    assert [(e["type"], e["message"], e["attempt"]) for e in seen_errors[1:]] == [
        ("ConnectionError", "refused on attempt 1", 1), ("ConnectionError", "refused on attempt 2", 2)]


def test_start_and_wait_names_its_run(monkeypatch):
    from django_durable.services import runs

    with pytest.raises(durable.WaitTimeout) as timed_out:  # nothing advances it: the timeout names it
        durable.start_and_wait("tests.three_steps", x=1, timeout=0.2)
    assert WorkflowRun.objects.get(pk=timed_out.value.run_id).status == "pending"
    waited = runs.wait
    monkeypatch.setattr(runs, "wait", lambda run_id, timeout=None: (drain(), waited(run_id, timeout))[1])
    run = durable.start_and_wait("tests.three_steps", x=2, timeout=5, return_run=True)
    assert isinstance(run, WorkflowRun) and run.status == "completed" and run.get_result() == [2, 3, 4]
    assert durable.start_and_wait("tests.three_steps", x=2, timeout=5) == [2, 3, 4]
    with pytest.raises(durable.WorkflowFailed) as failed:
        durable.start_and_wait("tests.raises", timeout=5)
    assert WorkflowRun.objects.get(pk=failed.value.run_id).status == "failed"


def test_ensure_schedule_keeps_a_paused_schedule_paused_unless_told():
    schedules.ensure_schedule("boot", "tests.three_steps", interval=60)
    schedules.pause("boot")
    schedules.ensure_schedule("boot", "tests.three_steps", interval=60)  # the next deploy's boot
    assert schedules.get("boot").status == Schedule.Status.PAUSED
    schedules.ensure_schedule("boot", "tests.three_steps", interval=60, enabled=True)
    assert schedules.get("boot").status == Schedule.Status.ACTIVE
    schedules.ensure_schedule("new", "tests.three_steps", interval=60)
    assert schedules.get("new").status == Schedule.Status.ACTIVE


def hold(i):
    return i


@durable.workflow("tests.small.nap")
def nap(ctx, seconds):
    ctx.sleep("nap", seconds)


@durable.workflow("tests.small.fan")
def fan(ctx, n):
    return len(ctx.map("items", hold, range(n)))


def test_the_kind_of_wait_filters_and_a_fan_outs_count_is_current(admin_user):
    sleeper = durable.start(nap, 3600)
    signalled = durable.start("tests.awaits_shipping", 3)
    fanned = durable.start(fan, 5)
    drain(max_items=3)  # the three runs begin to wait; no branch has run yet
    drain(max_items=2)  # two branches of the fan-out finish
    client = APIClient()
    client.force_authenticate(admin_user)

    def ids(kind):
        response = client.get("/api/durable/workflows/", {"waiting_for": kind})
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    assert ids("sleep") == {str(sleeper.pk)}
    assert ids("event") == {str(signalled.pk)}
    assert ids("children") == {str(fanned.pk)}
    assert client.get("/api/durable/workflows/", {"waiting_for": "nap"}).status_code == 400
    detail = client.get(f"/api/durable/workflows/{fanned.pk}/").json()
    assert detail["waiting_for"] == "children"
    assert detail["waiting_on"] == "parallel 'items': 2 of 5 branches done"
    assert detail["progress"] == {"done": 2, "total": 5, "message": "parallel 'items'"}
    assert WorkflowRun.objects.get(pk=fanned.pk).waiting_on == "parallel 'items': 0 of 5 branches done"


def test_the_package_names_the_django_version_it_is_tested_on():
    """Issue 30: CI runs the suite on Django 5.2 and on the newest 6.x; the classifiers name each."""
    import tomllib
    from pathlib import Path

    import django

    project = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
    running = f"Framework :: Django :: {django.VERSION[0]}.{django.VERSION[1]}"
    assert running in project["classifiers"], f"{running!r} is tested here but not in pyproject.toml"
