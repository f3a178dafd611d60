"""Retention: each workflow's own (retention=), the default, and the built-in prune that runs itself."""

import datetime as dt
import io
import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.utils import timezone

import django_durable as durable
from django_durable import registry, retention, schedules
from django_durable.models import Schedule, Step, WorkflowRun
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def finished(workflow, ago: dt.timedelta, n: int = 1) -> list:
    """`n` completed runs of `workflow` that finished `ago`."""
    runs = [durable.start(workflow) for _ in range(n)]
    drain()
    WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).update(finished_at=timezone.now() - ago)
    assert set(WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True)) == {"completed"}
    return [r.pk for r in runs]


def left(pks) -> set:
    return set(WorkflowRun.objects.filter(pk__in=pks).values_list("pk", flat=True))


def test_each_workflow_keeps_its_runs_for_its_own_retention(settings):
    settings.DURABLE_RETENTION = dt.timedelta(days=7)
    hour_old = {name: finished(name, dt.timedelta(hours=2)) for name in ("tests.short_lived", "tests.three_steps")}
    month_old = {name: finished(name, dt.timedelta(days=30)) for name in ("tests.kept_long", "tests.three_steps")}
    fresh = finished("tests.short_lived", dt.timedelta(minutes=5))
    waiting = durable.start("tests.approval").pk
    assert retention.count() == 2
    assert retention.prune() == (2, 0)
    assert not left(hour_old["tests.short_lived"] + month_old["tests.three_steps"])
    kept = hour_old["tests.three_steps"] + month_old["tests.kept_long"] + fresh + [waiting]
    assert left(kept) == set(kept)
    assert not Step.objects.filter(run_id__in=hour_old["tests.short_lived"]).exists()


def test_the_built_in_prune_runs_as_a_workflow_in_batches(settings):
    settings.DURABLE_RETENTION = dt.timedelta(days=7)
    old = finished("tests.three_steps", dt.timedelta(days=8), n=5) + finished("tests.short_lived", dt.timedelta(days=1))
    kept = finished("tests.three_steps", dt.timedelta(days=1))
    run = durable.start(retention.PRUNE_WORKFLOW, batch=2)
    drain()
    run.refresh_from_db()
    assert (run.status, run.get_result()) == ("completed", {"runs": 6, "events": 0})
    steps = [(key, json.loads(result)) for key, result in Step.objects.filter(run=run).order_by("seq")
             .values_list("key", "result")]
    assert steps == [
        ("plan", [{"seconds": 90 * 86400.0, "workflows": ["tests.kept_long"], "others": []},
                  {"seconds": 3600.0, "workflows": ["tests.short_lived"], "others": []},
                  {"seconds": 7 * 86400.0, "workflows": None, "others": ["tests.kept_long", "tests.short_lived"]}]),
        ("expired partitions", []),  # a plain runs table has none
        ("runs 1.1", 0), ("runs 2.1", 1), ("runs 3.1", 2), ("runs 3.2", 2), ("runs 3.3", 1), ("events", 0),
        ("orphaned payloads", 0), ("partitions", {"made": [], "dropped": []}), ("idle gates", 0)]  # a plain journal: none
    assert not left(old) and left(kept) == set(kept)


def test_every_worker_declares_the_prune_schedule_and_none_turns_it_off(settings):
    schedules.sync_declared()
    schedule = Schedule.objects.get(slug=retention.PRUNE_WORKFLOW)
    assert (schedule.workflow, schedule.cron, schedule.declared) == ("durable.prune", "17 3 * * *", True)
    settings.DURABLE_PRUNE_SCHEDULE = None
    try:
        retention.register_prune()
        schedules.sync_declared()
        assert not Schedule.objects.filter(slug=retention.PRUNE_WORKFLOW).exists()
    finally:
        settings.DURABLE_PRUNE_SCHEDULE = "17 3 * * *"
        retention.register_prune()


def test_the_command_prunes_by_each_workflows_retention_unless_told_an_age(settings):
    settings.DURABLE_RETENTION = dt.timedelta(days=7)
    short = finished("tests.short_lived", dt.timedelta(hours=2))
    other = finished("tests.three_steps", dt.timedelta(hours=2))
    out = io.StringIO()
    call_command("durable", "prune", stdout=out)
    assert "deleted 1 finished run(s) past their retention" in out.getvalue()
    assert not left(short) and left(other) == set(other)
    call_command("durable", "prune", "--older-than", "1h", stdout=out)
    assert not left(other)


def test_a_retention_must_be_positive():
    with pytest.raises(ImproperlyConfigured, match="retention of 0:00:00; it must be positive"):
        durable.workflow("tests.never_kept", retention=0)(lambda ctx: None)
    with pytest.raises(ImproperlyConfigured, match="retention='a week'"):
        durable.workflow("tests.badly_kept", retention="a week")(lambda ctx: None)
    assert "tests.never_kept" not in {d.name for d in registry.definitions()}


@pytest.mark.django_db
def test_the_prune_deletes_the_gates_and_fair_turns_of_keys_unused_for_the_retention():
    import datetime as dt

    from django.utils import timezone

    from django_durable.models import FairTurn, StartGate
    from django_durable.retention import delete_idle_gates

    old = StartGate.objects.create(workflow="w", kind="throttle", key="old")
    StartGate.objects.create(workflow="w", kind="throttle", key="recent")
    StartGate.objects.filter(pk=old.pk).update(updated_at=timezone.now() - dt.timedelta(days=400))
    FairTurn.objects.create(queue="reports", key="old", turn=timezone.now() - dt.timedelta(days=400))
    FairTurn.objects.create(queue="reports", key="recent", turn=timezone.now())
    assert delete_idle_gates() == 2
    assert list(StartGate.objects.values_list("key", flat=True)) == ["recent"]
    assert list(FairTurn.objects.values_list("key", flat=True)) == ["recent"]
