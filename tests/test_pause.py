"""RetryPolicy(on_exhausted="pause"): a run whose step ran out of attempts is held `paused` for an
operator, its journal, waits and children kept, its parent and waiters seeing it still running;
resumed (the step again, fresh attempts, on the code installed then) or failed on purpose."""

import io

import pytest
from django.core.management import call_command

import django_durable as durable
from django_durable.exceptions import ChildFailed, WaitTimeout
from django_durable.models import Step, WorkflowEvent, WorkflowRun
from django_durable.testing import drain
from tests.conftest import ledger_counts

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/django_durable/workflowrun/"


@durable.workflow("tests.pause_parent")
def pause_parent(ctx, flag):
    return ctx.child("paying", "tests.pauses", flag)


def paused_run(tmp_path, flag_name="declined"):
    """A parent whose child (tests.pauses) paused at its step "charge" after 2 attempts."""
    flag = tmp_path / flag_name
    flag.touch()
    parent = durable.start("tests.pause_parent", str(flag))
    drain()
    child = WorkflowRun.objects.get(parent=parent.pk)
    durable.signal(child.pk, "go")
    drain()
    return parent, WorkflowRun.objects.get(pk=child.pk), flag


def test_a_step_out_of_attempts_pauses_its_run_and_resume_goes_on_from_it(tmp_path):
    parent, child, flag = paused_run(tmp_path)
    assert child.status == "paused"
    assert child.waiting_on == "an operator: step 'charge' failed 2 times (ValueError)"
    assert ledger_counts(child.pk) == {"before": 1, "charge": 2}
    entry = Step.objects.get(run=child, key="charge")
    assert (entry.status, entry.attempts) == ("paused", 2) and "card declined" in entry.error
    event = WorkflowEvent.objects.get(run=child, type="paused")
    assert event.data == {"step": "charge", "attempts": 2}
    # Nothing failed: the parent waits on, its own child goes on waiting, a waiter sees it unfinished.
    assert WorkflowRun.objects.get(pk=parent.pk).status == "waiting"
    assert WorkflowRun.objects.get(parent=child.pk).status == "waiting"
    with pytest.raises(WaitTimeout):
        durable.wait(child.pk, timeout=0.2)
    # Woken while paused (a signal), it holds again without calling the step.
    durable.signal(child.pk, "unrelated")
    drain()
    assert WorkflowRun.objects.get(pk=child.pk).status == "paused"
    assert ledger_counts(child.pk)["charge"] == 2
    assert WorkflowEvent.objects.filter(run=child, type="paused").count() == 1
    assert child.pk not in durable.recover()  # held on purpose, not stuck

    flag.unlink()  # the fix, deployed
    resumed = durable.retry_run(child.pk, by="ops")
    assert resumed.status == "pending"
    drain()
    done = WorkflowRun.objects.get(pk=child.pk)
    assert done.status == "completed" and done.get_result() == "charge"
    assert ledger_counts(child.pk) == {"before": 1, "charge": 3}  # "before" not again
    entry = Step.objects.get(run=child, key="charge")
    assert (entry.status, entry.attempts) == ("completed", 1) and "card declined" in entry.error  # why it paused, kept
    assert WorkflowEvent.objects.get(run=child, type="retried").data == {"from": "paused"}
    assert WorkflowRun.objects.get(pk=parent.pk).status == "completed"


def test_the_deploy_replay_check_replays_a_paused_run_to_its_paused_step(tmp_path):
    """The replay check (a stand-in session of the context) meets the paused entry as the worker
    does: it stops there, having used every entry before it, so a paused run passes as it is."""
    from django_durable.replaycheck import check_replay, check_run

    parent, child, flag = paused_run(tmp_path)
    verdict = check_run(child)
    assert (verdict.status, verdict.ok, verdict.reason) == ("paused", True, "")
    assert {v.run_id: v.ok for v in check_replay()}[str(child.pk)] is True


def test_a_paused_run_pauses_again_when_the_fix_did_not_fix_it(tmp_path):
    parent, child, flag = paused_run(tmp_path)
    durable.retry_run(child.pk)
    drain()
    assert WorkflowRun.objects.get(pk=child.pk).status == "paused"
    assert ledger_counts(child.pk)["charge"] == 4  # two fresh attempts
    assert WorkflowEvent.objects.filter(run=child, type="paused").count() == 2


def test_a_paused_run_failed_on_purpose_fails_its_parent(tmp_path):
    parent, child, flag = paused_run(tmp_path)
    durable.force_fail(child.pk, "the customer went elsewhere", by="ops")
    drain()
    assert WorkflowRun.objects.get(pk=child.pk).status == "failed"
    failed = WorkflowRun.objects.get(pk=parent.pk)
    assert failed.status == "failed" and ChildFailed.__name__ in failed.get_error()["type"]


def test_a_paused_run_cancelled_ends_cancelled(tmp_path):
    parent, child, flag = paused_run(tmp_path)
    assert durable.cancel(child.pk).status == "cancelled"


def test_a_non_retryable_error_fails_even_under_a_pausing_policy():
    policy = durable.RetryPolicy(on_exhausted="pause")
    assert policy.pauses(ValueError()) and not policy.pauses(durable.NonRetryableError("no"))
    assert not durable.RetryPolicy().pauses(ValueError())
    with pytest.raises(ValueError, match="on_exhausted"):
        durable.RetryPolicy(on_exhausted="maybe")


def test_the_admin_shows_what_paused_it_and_resumes_it(admin_client, client, django_user_model, tmp_path):
    parent, child, flag = paused_run(tmp_path)
    page = admin_client.get(f"{RUNS}{child.pk}/change/").content.decode()
    assert 'id="durable-paused"' in page and "ValueError: card declined while declined exists" in page
    assert "durable-paused-traceback" in page
    assert ">Resume</a>" in page and "Force fail" in page
    listed = admin_client.get(f"{RUNS}?waiting_for=operator").content.decode()
    assert f"/{child.pk}/change/" in listed and f"/{parent.pk}/change/" not in listed
    # Without the payload permission: the step and the error's type, not its message.
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    from django.contrib.auth.models import Permission

    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    client.force_login(viewer)
    hidden = client.get(f"{RUNS}{child.pk}/change/").content.decode()
    assert 'id="durable-paused"' in hidden and "card declined" not in hidden
    flag.unlink()
    response = admin_client.post(f"{RUNS}{child.pk}/do/retry/", {"apply": "1"})
    assert response.status_code == 302
    drain()
    assert WorkflowRun.objects.get(pk=child.pk).status == "completed"


def test_the_api_and_the_command_line_see_it_paused_and_resume_it(admin_client, tmp_path):
    parent, child, flag = paused_run(tmp_path)
    body = admin_client.get(f"/api/durable/workflows/{child.pk}/").json()
    assert body["status"] == "paused" and "step 'charge'" in body["waiting_on"]
    flag.unlink()
    assert admin_client.post(f"/api/durable/workflows/{child.pk}/retry/").status_code == 202
    drain()
    assert WorkflowRun.objects.get(pk=child.pk).status == "completed"

    other_parent, other, other_flag = paused_run(tmp_path, "declined-again")
    other_flag.unlink()
    out = io.StringIO()
    call_command("durable", "retry", str(other.pk), stdout=out)
    assert "pending" in out.getvalue()
    drain()
    assert WorkflowRun.objects.get(pk=other.pk).status == "completed"


def test_a_repair_by_filter_resumes_paused_runs(tmp_path):
    parent, child, flag = paused_run(tmp_path)
    assert durable.plan_repair("retry", status="paused")["eligible"] == 1
    flag.unlink()
    durable.repair("retry", status="paused", by="ops")
    drain()
    assert WorkflowRun.objects.get(pk=child.pk).status == "completed"


def test_a_parallel_branch_out_of_attempts_pauses_its_run_and_its_siblings_finish(tmp_path):
    flag = tmp_path / "declined"
    flag.touch()
    run = durable.start("tests.pauses_a_branch", str(flag))
    drain()
    paused = WorkflowRun.objects.get(pk=run.pk)
    assert paused.status == "paused" and paused.waiting_on == "an operator: step 'card' failed 2 times (ValueError)"
    assert ledger_counts(run.pk) == {"ok": 1, "card": 2}
    assert dict(Step.objects.filter(run=run).values_list("key", "status")) == {
        "pay": "waiting", "ok": "completed", "card": "paused"}
    assert WorkflowEvent.objects.get(run_id=run.pk, type="paused").data == {"step": "card", "attempts": 2}
    durable.signal(run.pk, "unrelated")  # woken, it holds again; the branch is not tried
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "paused" and ledger_counts(run.pk)["card"] == 2
    flag.unlink()
    durable.retry_run(run.pk, by="ops")
    drain()
    done = WorkflowRun.objects.get(pk=run.pk)
    assert done.status == "completed" and done.get_result() == ["ok", "card"]
    assert ledger_counts(run.pk) == {"ok": 1, "card": 3}


def test_a_paused_run_resumes_on_the_code_deployed_since(tmp_path, monkeypatch):
    """The fix is a new body of the same function (as a deploy makes it): the resumed step runs it."""
    from tests.testapp import workflows

    flag = tmp_path / "declined"
    flag.touch()  # stays: only the code changes
    run = durable.start("tests.pauses_a_branch", str(flag))
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "paused"

    def fixed(run_id, key, flag):
        return f"{key} (fixed)"

    fixed.__module__, fixed.__qualname__ = workflows.declined_while.__module__, workflows.declined_while.__qualname__
    monkeypatch.setattr(workflows, "declined_while", fixed)
    durable.retry_run(run.pk)
    drain()
    done = WorkflowRun.objects.get(pk=run.pk)
    assert done.status == "completed" and done.get_result() == ["ok", "card (fixed)"]
