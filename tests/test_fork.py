"""durable.fork(): a new run from a chosen step of an old one, its journal before the step copied."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import Step, WorkflowEvent, WorkflowRun
from django_durable.testing import drain
from tests.conftest import ledger_counts

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed_run(tmp_path):
    """A run of tests.fork_me that failed at step b (its bug), and the path that deploys the fix."""
    fix = tmp_path / "fixed"
    run = durable.start("tests.fork_me", fix_path=str(fix))
    drain()
    run.refresh_from_db()
    assert run.status == "failed" and ledger_counts(run.pk) == {"a": 1, "b": 1}
    return run, fix


def journal(run) -> list[tuple]:
    return list(Step.objects.filter(run=run).order_by("seq").values_list("seq", "key", "kind", "status"))


def test_a_fork_copies_the_journal_before_the_step_and_runs_the_rest_on_todays_code(failed_run):
    run, fix = failed_run
    fix.touch()  # the fix is deployed
    fork = durable.fork(run.pk, from_step="b", by="alice")
    assert (fork.workflow, fork.forked_from, fork.forked_at_step) == ("tests.fork_me", run.pk, "b")
    assert fork.get_input() == run.get_input()
    # Copied: step a and the note after it, with their results, before any worker has seen the fork;
    # not the progress (one entry, kept running and rewritten in place: the fork sets its own).
    assert journal(fork) == [(1, "a", "step", "completed"), (3, "note:0", "log", "completed")]
    drain()
    fork.refresh_from_db()
    assert fork.status == "completed" and fork.get_result() == [1, 10, 11]
    assert ledger_counts(fork.pk) == {"b": 1, "c": 1}  # a was not run again
    assert ledger_counts(run.pk) == {"a": 1, "b": 1}  # nor anything of the source
    assert {key for _, key, _, _ in journal(fork)} == {"a", "progress", "note:0", "b", "c"}
    trail = dict(WorkflowEvent.objects.filter(type="forked").values_list("run_id", "data"))
    assert trail == {fork.pk: {"source": str(run.pk), "step": "b"}, run.pk: {"fork": str(fork.pk), "step": "b"}}
    assert WorkflowEvent.objects.get(run=fork, type="forked").actor == "alice"

    again = durable.fork(run.pk, from_step="a")  # from the first step: nothing copied, a runs again
    assert journal(again) == []
    drain()
    assert ledger_counts(again.pk) == {"a": 1, "b": 1, "c": 1}
    assert set(WorkflowRun.objects.filter(forked_from=run.pk).values_list("pk", flat=True)) == {fork.pk, again.pk}


@durable.workflow("tests.fork.fan_out")
def fan_out(ctx):
    first = ctx.step("first", lambda: 1)
    squares = ctx.map("squares", abs, [-1, -2, -3])
    answer = ctx.wait_for_signal("answer")
    return [first, squares, answer]


def test_a_fork_is_refused_where_the_copy_would_be_unsafe(failed_run):
    run = durable.start(fan_out)
    drain()  # the fan-out done; the run waits for its signal
    with pytest.raises(durable.InvalidTransition, match=r"'squares:1' is a branch of the fan-out 'squares'"):
        durable.fork(run.pk, from_step="squares:1")
    assert durable.fork(run.pk, from_step="squares").forked_at_step == "squares"  # the fan-out itself: fine
    # Forking from a key after the wait that has not ended would copy the wait half-done.
    durable.signal(run.pk, "answer", 42)
    drain()
    run.refresh_from_db()
    assert run.status == "completed"
    late = durable.start(fan_out)
    drain()  # it waits for its signal: the wait's entry is not over
    Step.objects.create(run=late, key="later", seq=99, kind="step", status="completed", result="1")
    with pytest.raises(durable.InvalidTransition, match="a wait for a signal not over comes before it"):
        durable.fork(late.pk, from_step="later")

    keys = list(Step.objects.filter(run=failed_run[0]).exclude(kind__in=["log", "progress"])
                .order_by("seq").values_list("key", flat=True))
    with pytest.raises(durable.StepNotFound, match="its keys are " + re.escape(", ".join(map(repr, keys)))):
        durable.fork(failed_run[0].pk, from_step="no-such-step")
    with pytest.raises(durable.WorkflowNotFound):
        durable.fork("01900000-0000-7000-8000-000000000000", from_step="a")
    from tests.testapp.tasks import meaning_of_life

    task_run = WorkflowRun.objects.get(pk=meaning_of_life.enqueue().id)
    with pytest.raises(durable.InvalidTransition, match="is a task"):
        durable.fork(task_run.pk, from_step="a")


@durable.workflow("tests.fork.waiting_child")
def waiting_child(ctx):
    return ctx.wait_for_signal("go")


@durable.workflow("tests.fork.parent")
def parent_of_waiting(ctx):
    before = ctx.step("before", lambda: 1)
    kid = ctx.child("kid", waiting_child)
    return [before, kid, ctx.step("after", lambda: 2)]


def test_a_fork_is_refused_while_a_child_before_the_step_runs():
    parent = durable.start(parent_of_waiting)
    drain()
    Step.objects.create(run=parent, key="after", seq=50, kind="step", status="completed", result="2")
    with pytest.raises(durable.InvalidTransition, match=r"a child workflow still running comes before it \('kid'"):
        durable.fork(parent.pk, from_step="after")
    assert durable.fork(parent.pk, from_step="kid").forked_at_step == "kid"  # the child itself starts anew


def test_the_api_the_command_and_the_admin_fork(failed_run, admin_user, admin_client):
    run, fix = failed_run
    fix.touch()
    client = APIClient()
    client.force_authenticate(admin_user)
    answer = client.post(f"/api/durable/workflows/{run.pk}/fork/", {"from_step": "b"}, format="json")
    assert answer.status_code == 201, answer.content
    forked = answer.json()
    assert (forked["forked_from"], forked["forked_at_step"], forked["status"]) == (str(run.pk), "b", "pending")
    assert client.get(f"/api/durable/workflows/{run.pk}/").json()["forks"] == [forked["id"]]
    unknown = client.post(f"/api/durable/workflows/{run.pk}/fork/", {"from_step": "zz"}, format="json")
    assert unknown.status_code == 400 and "zz" in json.dumps(unknown.json()), unknown.json()
    assert client.post(f"/api/durable/workflows/{run.pk}/fork/", {}, format="json").status_code == 400

    out = io.StringIO()
    call_command("durable", "fork", str(run.pk), "--from-step", "b", "--json", stdout=out)
    by_command = json.loads(out.getvalue())
    assert WorkflowRun.objects.get(pk=by_command["id"]).forked_at_step == "b"

    page = admin_client.get(f"/admin/django_durable/workflowrun/{run.pk}/change/").content.decode()
    assert "/do/fork/?from_step=b" in page and "Forks" in page
    form = admin_client.get(f"/admin/django_durable/workflowrun/{run.pk}/do/fork/?from_step=b")
    assert form.status_code == 200 and '<option value="b" selected>' in form.content.decode()
    posted = admin_client.post(f"/admin/django_durable/workflowrun/{run.pk}/do/fork/", {"from_step": "a"})
    assert posted.status_code == 302
    fork = WorkflowRun.objects.filter(forked_from=run.pk, forked_at_step="a").get()
    assert posted["Location"].endswith(f"/workflowrun/{fork.pk}/change/")
    shown = admin_client.get(posted["Location"]).content.decode()
    assert "Forked from" in shown and str(run.pk) in shown
    drain()
    assert WorkflowRun.objects.filter(forked_from=run.pk, status="completed").count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_fork_runs_on_worker_processes_without_redoing_the_copied_steps(start_worker, tmp_path):
    fix = tmp_path / "fixed"
    run = durable.start("tests.fork_me", fix_path=str(fix))
    start_worker().wait()
    run.refresh_from_db()
    assert run.status == "failed"
    fix.touch()
    fork = durable.fork(run.pk, from_step="b")
    start_worker().wait()
    fork.refresh_from_db()
    assert fork.status == "completed" and fork.get_result() == [1, 10, 11]
    assert ledger_counts(fork.pk) == {"b": 1, "c": 1} and ledger_counts(run.pk) == {"a": 1, "b": 1}
    assert not WorkflowRun.objects.unfinished().exists()
