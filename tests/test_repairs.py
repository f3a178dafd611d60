"""Repairs by filter (services/repairs.py): the plan, the durable.repair run that applies it in
batches, and the same from the admin, the REST API and the command line; then 10,000 failed runs
repaired while worker processes run beside it."""

import io
import os
import re
import time
from collections import Counter, defaultdict

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.utils import timezone

import django_durable as durable
from django_durable import serialization
from django_durable.exceptions import InvalidArguments
from django_durable.models import WorkflowEvent, WorkflowRun, WorkItem
from django_durable.services import repairs
from django_durable.testing import drain
from tests.harness.workers import wait_for
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/django_durable/workflowrun/"


def failed_runs(n: int, workflow: str = "tests.repairable", message: str = "card declined") -> list:
    """`n` runs of `workflow` ended failed, as a bad deploy leaves them: made at once (start_many),
    their advance items done, then failed with `message`."""
    ids = durable.start_many(workflow, [{"order": index} for index in range(n)])
    error = serialization.dumps_error(ValueError(message))
    WorkItem.objects.filter(run_id__in=ids).update(status=WorkItem.Status.FAILED)
    WorkflowRun.objects.filter(pk__in=ids).update(status=WorkflowRun.Status.FAILED, error=error,
                                                   finished_at=timezone.now())
    return ids


def test_a_plan_counts_and_samples_and_changes_nothing():
    failed = failed_runs(12)
    other = failed_runs(3, message="timeout talking to the bank")
    durable.start("tests.approval")
    drain()
    plan = repairs.plan("retry", repairs.RunFilter.parse({"workflow": "tests.repairable", "error": "DECLINED"}))
    assert (plan.matched, plan.eligible, len(plan.sample)) == (12, 12, 10)
    assert {row["id"] for row in plan.sample} <= {str(pk) for pk in failed}
    assert plan.until == str(max(failed))
    assert WorkflowRun.objects.filter(pk__in=failed + other, status="failed").count() == 15
    cancel = repairs.plan("cancel", repairs.RunFilter.parse({"status": ["failed", "waiting"]}))
    assert (cancel.matched, cancel.eligible) == (16, 1)  # only the waiting one is unfinished


@pytest.mark.parametrize("data, problem", [
    ({}, "at least one condition"),
    ({"colour": "red"}, "no 'colour'"),
    ({"status": "broken"}, "not a run status"),
    ({"status": 5}, "not a run status"),
    ({"status": ["failed", {"x": 1}]}, "not a run status"),
    ({"created_after": "2026-11-28T09:00:00"}, "time zone"),
    ({"created_after": "2026-13-45T09:00:00+00:00"}, "time zone"),
    ({"workflow": 3}, "is a string"),
])
def test_a_filter_is_checked(data, problem):
    with pytest.raises(InvalidArguments, match=problem):
        repairs.RunFilter.parse(data)


def test_a_repair_retries_in_batches_audited_and_goes_no_further_than_its_plan():
    failed = failed_runs(25)
    run, plan = repairs.start("retry", repairs.RunFilter.parse({"status": "failed"}), by="ops", batch=10)
    later = failed_runs(2)  # failed after the plan: not the repair's
    drain()
    repaired = WorkflowRun.objects.get(pk=run.pk)
    assert repaired.status == "completed"
    assert repaired.get_result() == {"repair": "retry", "filter": {"status": ["failed"]}, "done": 25, "skipped": {}}
    assert WorkflowRun.objects.filter(pk__in=failed, status="completed").count() == 25
    assert WorkflowRun.objects.filter(pk__in=later, status="failed").count() == 2
    retried = Counter(WorkflowEvent.objects.filter(type="retried").values_list("run_id", "actor"))
    assert retried == {(pk, "ops"): 1 for pk in failed}
    assert sorted(repaired.steps.exclude(kind="progress").values_list("key", flat=True)) == \
        ["apply 1", "apply 2", "apply 3", "pick 1", "pick 2", "pick 3", "since"]
    assert WorkflowEvent.objects.get(run=run, type="started").actor == "ops"


def test_a_batch_done_again_changes_and_counts_each_run_once():
    """As when its step is retried after a database error part way: the runs it retried already
    are counted, not retried again; the others are retried now."""
    from django_durable import clock

    failed = failed_runs(6)
    since = clock.database_now("default").isoformat()
    run_filter = repairs.RunFilter.parse({"status": "failed"})
    ids = repairs.pick_batch("retry", run_filter.as_data(), after=None, until=str(max(failed)), batch=10)
    assert repairs.apply_batch("retry", ids[:4], by="ops", since=since) == {"done": 4, "skipped": {}}
    assert repairs.apply_batch("retry", ids, by="ops", since=since) == {"done": 6, "skipped": {}}
    retried = Counter(WorkflowEvent.objects.filter(type="retried").values_list("run_id", flat=True))
    assert retried == {pk: 1 for pk in failed}


def test_cancel_and_force_fail_by_filter_take_unfinished_runs_with_the_reason():
    waiting = [durable.start("tests.approval").pk for _ in range(3)]
    sleeping = durable.start("tests.sleeper", 3600)
    drain()
    run, _ = repairs.start("cancel", repairs.RunFilter.parse({"workflow": "tests.approval"}), by="ops",
                           reason="the promotion ended")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result()["done"] == 3
    for pk in waiting:
        cancelled = WorkflowRun.objects.get(pk=pk)
        assert cancelled.status == "cancelled" and cancelled.get_error()["message"] == "the promotion ended"
    assert WorkflowRun.objects.get(pk=sleeping.pk).status == "waiting"
    run, _ = repairs.start("force-fail", repairs.RunFilter.parse({"workflow": "tests.sleeper"}), by="ops")
    drain()
    assert WorkflowRun.objects.get(pk=sleeping.pk).status == "failed"
    assert WorkflowEvent.objects.get(run_id=sleeping.pk, type="force_failed").actor == "ops"


def test_a_rerun_forks_each_run_once_even_when_a_batch_is_done_again():
    failed = failed_runs(4)
    for pk in failed:  # a journal to fork from: the step before the one to rerun
        WorkflowRun.objects.filter(pk=pk).update(status="pending", error=None, finished_at=None)
    WorkItem.objects.filter(run_id__in=failed).update(status="pending")
    drain()
    run_filter = repairs.RunFilter.parse({"workflow": "tests.repairable"})
    plan = repairs.plan("rerun", run_filter, from_step="charge")
    since = timezone.now().isoformat()
    ids = repairs.pick_batch("rerun", run_filter.as_data(), after=None, until=plan.until, batch=10)
    first = repairs.apply_batch("rerun", ids, by="ops", from_step="charge", since=since)
    again = repairs.apply_batch("rerun", ids, by="ops", from_step="charge", since=since)
    assert first == again == {"done": 4, "skipped": {}}
    assert WorkflowRun.objects.filter(forked_from__in=failed).count() == 4
    with pytest.raises(InvalidArguments, match="from_step"):
        repairs.plan("rerun", run_filter)


def test_the_admin_previews_then_applies_with_the_actions_permission(admin_client, client, django_user_model):
    failed = failed_runs(5)
    page = admin_client.get(f"{RUNS}?status__exact=failed&workflow=tests.repairable").content.decode()
    assert f"{RUNS}repair/?status__exact=failed&amp;workflow=tests.repairable" in page
    form = admin_client.get(f"{RUNS}repair/?status__exact=failed&workflow=tests.repairable").content.decode()
    assert 'value="tests.repairable"' in form
    assert re.search(r'<input type="checkbox" name="status" value="failed"[^>]*checked', form)
    preview = admin_client.get(f"{RUNS}repair/", {"preview": "1", "repair": "retry", "status": "failed",
                                                   "workflow": "tests.repairable", "batch": "2"}).content.decode()
    assert "<strong>5</strong> runs match" in preview and "would take <strong>5</strong>" in preview
    assert "Apply to 5 runs" in preview and str(failed[-1]) in preview
    assert WorkflowRun.objects.filter(status="failed").count() == 5  # a preview changes nothing

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    client.force_login(viewer)
    fields = {"repair": "retry", "status": "failed", "workflow": "tests.repairable", "batch": "2"}
    assert "Apply to" not in client.get(f"{RUNS}repair/", {"preview": "1", **fields}).content.decode()
    assert client.post(f"{RUNS}repair/", fields).status_code == 403

    response = admin_client.post(f"{RUNS}repair/", fields)
    repair = WorkflowRun.objects.get(workflow="durable.repair")
    assert response.status_code == 302 and response["Location"] == f"{RUNS}{repair.pk}/change/"
    drain()
    assert WorkflowRun.objects.filter(pk__in=failed, status="completed").count() == 5
    assert set(WorkflowEvent.objects.filter(type="retried").values_list("actor", flat=True)) == {"admin"}


def test_the_api_answers_a_dry_run_then_starts_the_repair(admin_client, client, django_user_model):
    failed = failed_runs(3)
    body = {"repair": "retry", "filter": {"status": "failed"}}
    dry = admin_client.post("/api/durable/workflows/repair/", body, content_type="application/json")
    assert dry.status_code == 200 and (dry.json()["matched"], dry.json()["eligible"]) == (3, 3)
    assert WorkflowRun.objects.filter(status="failed").count() == 3
    bad = admin_client.post("/api/durable/workflows/repair/", {"repair": "retry", "filter": {"status": "nope"}},
                            content_type="application/json")
    assert bad.status_code == 400 and "filter.status" in bad.json()["error"]["fields"]
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    client.force_login(viewer)
    refused = client.post("/api/durable/workflows/repair/", {**body, "dry_run": False}, content_type="application/json")
    assert refused.status_code == 403 and "retry_workflowrun" in refused.json()["error"]["message"]
    started = admin_client.post("/api/durable/workflows/repair/", {**body, "dry_run": False},
                                content_type="application/json")
    assert started.status_code == 202
    drain()
    assert WorkflowRun.objects.get(pk=started.json()["run"]).get_result()["done"] == 3
    assert WorkflowRun.objects.filter(pk__in=failed, status="completed").count() == 3


def test_a_scoped_api_does_not_offer_repairs(admin_client, settings):
    settings.DURABLE_API_QUERYSET_FILTER = lambda request, runs: runs.filter(queue="mine")
    response = admin_client.post("/api/durable/workflows/repair/", {"repair": "retry", "filter": {"status": "failed"}},
                                 content_type="application/json")
    assert response.status_code == 403 and "DURABLE_API_QUERYSET_FILTER" in response.json()["error"]["message"]


def test_the_command_line_shows_the_plan_then_applies_it():
    failed = failed_runs(4)
    out = io.StringIO()
    call_command("durable", "repair", "retry", "--status", "failed", "--workflow", "tests.repairable", stdout=out)
    assert "4 run(s) match workflow tests.repairable, status failed; retry would take 4." in out.getvalue()
    assert "add --apply" in out.getvalue() and WorkflowRun.objects.filter(status="failed").count() == 4
    out = io.StringIO()
    call_command("durable", "repair", "retry", "--status", "failed", "--apply", "--batch", "3", stdout=out)
    assert "started: retry for 4 run(s)" in out.getvalue()
    drain()
    assert WorkflowRun.objects.filter(pk__in=failed, status="completed").count() == 4
    assert set(WorkflowEvent.objects.filter(type="retried").values_list("actor", flat=True)) == {
        WorkflowEvent.objects.get(run__workflow="durable.repair", type="started").actor}
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--created-after"):
        call_command("durable", "repair", "cancel", "--created-after", "yesterday", stdout=io.StringIO())


@pytest.mark.slow
def test_ten_thousand_failed_runs_repaired_with_workers_running_beside_it(start_worker):
    """A repair of failed runs while two worker processes run it and the runs it retries: each run
    retried once, its step run once more, and other work goes through meanwhile (no batch holds
    the tables). 1,000 runs in the suite; DURABLE_TEST_REPAIR_RUNS=10000 for the measurement
    bench/RESULTS.md records (about 100 runs a second, each through its own retry)."""
    n = int(os.environ.get("DURABLE_TEST_REPAIR_RUNS", "1000"))
    failed = failed_runs(n)
    ledger_before = len(ledger.entries())
    # SQLite hands its one write lock to no one in turn: while a worker writes without pause (a
    # batch of retries), another's heartbeat can wait seconds for it, and the fixture's 2 s lease
    # can run out, its step then run again as a lost worker's would (at least once). The check
    # here is that the repair retries each run once: a lease no such wait outlasts.
    lease = {"DURABLE_LEASE_SECONDS": "30"}
    workers = [start_worker(burst=False, env=lease), start_worker(burst=False, env=lease)]
    began = time.monotonic()
    run, plan = repairs.start("retry", repairs.RunFilter.parse({"workflow": "tests.repairable", "status": "failed"}),
                              by="ops", batch=500)
    assert plan.eligible == n
    # While it goes, other work is taken: the repair holds no lock on the tables between its runs.
    probes = []
    while WorkflowRun.objects.get(pk=run.pk).status not in WorkflowRun.TERMINAL:
        probe = durable.start("tests.repairable", order=-1)
        probes.append(probe.pk)
        wait_for(lambda: WorkflowRun.objects.get(pk=probe.pk).status == "completed", timeout=120,
                 message="a run started beside the repair")
        time.sleep(0.2)
    repaired = WorkflowRun.objects.get(pk=run.pk)
    assert repaired.status == "completed", repaired.get_error()
    steps = list(repaired.steps.exclude(kind="progress").order_by("seq").values_list("key", "status", "attempts"))
    assert repaired.get_result()["done"] == n and repaired.get_result()["skipped"] == {}, (repaired.get_result(), steps)
    wait_for(lambda: WorkflowRun.objects.filter(pk__in=failed, status="completed").count() == n, timeout=600,
             interval=0.5, message="every repaired run completed")
    for worker in workers:
        worker.signal(15)
        worker.wait()
    retried = Counter(WorkflowEvent.objects.filter(type="retried", actor="ops").values_list("run_id", flat=True))
    assert len(retried) == n and set(retried.values()) == {1}
    ran_by = defaultdict(list)  # run id: the pids that ran its step
    for run_id, step, pid in ledger.entries()[ledger_before:]:
        if step == "charge":
            ran_by[run_id].append(pid)
    odd = {str(pk): ran_by[str(pk)] for pk in failed if len(ran_by[str(pk)]) != 1}
    assert not odd, ("a repaired run's step ran other than once (run: the pids that ran it)", odd, list(
        WorkflowEvent.objects.filter(run_id__in=list(odd)).values_list("run_id", "type", "message")))
    assert probes, "the repair ended before a run beside it could be started"
    print(f"{n} runs repaired in {time.monotonic() - began:.1f} s with {len(probes)} runs started beside it")


def test_the_same_from_python():
    failed = failed_runs(3)
    plan = durable.plan_repair("retry", workflow="tests.repairable", status="failed")
    assert (plan["matched"], plan["eligible"]) == (3, 3)
    run = durable.repair("retry", workflow="tests.repairable", status="failed", by="alice", batch=2)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result()["done"] == 3
    assert set(WorkflowEvent.objects.filter(run_id__in=failed, type="retried").values_list("actor", flat=True)) == {"alice"}
