"""The operator actions as service functions: what the admin, the API and the CLI call."""

import datetime as dt

import pytest

import django_durable as durable
from django_durable import workpool
from django_durable.engine.replay import advance
from django_durable.models import Step, Timer, WorkflowEvent, WorkflowRun, WorkItem
from django_durable.testing import clock, drain
from tests.conftest import ledger_counts

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


def events(run):
    return list(WorkflowEvent.objects.filter(run_id=run.pk).values_list("type", "actor"))


@pytest.fixture
def flag(tmp_path):
    path = tmp_path / "broken"
    path.touch()
    return path


# -- retry from the last checkpoint ---------------------------------------------------------------


def test_retry_runs_a_failed_run_again_from_its_last_checkpoint(flag):
    run = durable.start("tests.flaky_middle", str(flag))
    drain()
    assert run_of(run).status == "failed"
    flag.unlink()
    retried = durable.retry_run(run.pk, by="alice")
    assert (retried.status, retried.error, retried.finished_at) == ("pending", None, None)
    drain()
    run = run_of(run)
    assert run.status == "completed" and run.get_result() == ["a", "b", "c"]
    assert ledger_counts(run.pk) == {"a": 1, "b": 2, "c": 1}  # the completed step did not run again
    assert events(run) == [("attempt_ended", ""), ("retried", "alice")]
    assert WorkflowEvent.objects.get(run_id=run.pk, type="retried").data == {"from": "failed"}
    ended = WorkflowEvent.objects.get(run_id=run.pk, type="attempt_ended").data  # the evidence the retry kept
    assert ended["error"]["message"].endswith("b is broken while broken exists")
    assert ended["steps"][0]["key"] == "b"


@pytest.mark.parametrize("status", ["completed", "waiting"])
def test_retry_refuses_a_run_that_did_not_fail(status):
    run = durable.start("tests.three_steps") if status == "completed" else durable.start("tests.approval")
    drain()
    assert run_of(run).status == status
    with pytest.raises(durable.InvalidTransition, match="only a failed, timed-out or cancelled run"):
        durable.retry_run(run.pk)
    assert run_of(run).status == status and events(run) == []


def test_retry_refuses_a_run_whose_compensations_ran():
    run = durable.start("tests.saga_auto")
    drain()
    assert run_of(run).status == "failed"
    with pytest.raises(durable.InvalidTransition, match="compensations .* already ran"):
        durable.retry_run(run.pk)


def test_retry_of_a_cancelled_run_resumes_its_wait():
    run = durable.start("tests.two_signals")
    drain()
    durable.cancel(run.pk, "by mistake", by="bob")
    assert run_of(run).status == "cancelled"
    durable.retry_run(run.pk)
    durable.signal(run.pk, "go", 1)
    durable.signal(run.pk, "go", 2)
    drain()
    assert run_of(run).get_result() == [1, 2]
    assert events(run) == [("cancelled", "bob"), ("attempt_ended", ""), ("retried", "")]
    assert WorkflowEvent.objects.filter(run_id=run.pk, type="cancelled").get().message == "by mistake"


def test_retry_gives_a_timed_out_run_a_fresh_deadline():
    with clock() as frozen:
        run = durable.start("tests.timed_waiter")
        drain()
        frozen.advance(seconds=61)
        drain()
        assert run_of(run).status == "timed_out"
        durable.retry_run(run.pk)
        run = run_of(run)
        assert run.deadline_at == frozen.now + dt.timedelta(seconds=60)
        drain()
        assert run_of(run).status == "waiting"  # not timed out again at once
        durable.signal(run.pk, "go")
        drain()
    assert run_of(run).status == "completed"
    assert ledger_counts(run.pk) == {"a": 1}


def test_retry_of_a_parent_retries_its_failed_child(flag):
    run = durable.start("tests.flaky_parent", str(flag))
    drain()
    assert run_of(run).status == "failed"
    child = WorkflowRun.objects.get(parent_id=run.pk)
    assert child.status == "failed"
    flag.unlink()
    durable.retry_run(run.pk)
    assert run_of(child).status == "pending"
    drain()
    assert run_of(run).get_result() == ["before", "work"]
    assert ledger_counts(run.pk) == {"before": 1}
    assert ledger_counts(child.pk) == {"work": 2}


# -- force fail ---------------------------------------------------------------------------------------


def test_force_fail_ends_a_waiting_run_and_cancels_its_timers_and_children():
    run = durable.start("tests.waiting_parent")
    drain()
    assert run_of(run).status == "waiting"
    failed = durable.force_fail(run.pk, "stuck on a vendor outage", by="carol")
    assert failed.status == "failed"
    assert failed.get_error()["type"] == "django_durable.exceptions.ForcedFailure"
    assert failed.get_error()["message"] == "stuck on a vendor outage"
    assert set(WorkflowRun.objects.filter(parent_id=run.pk).values_list("status", flat=True)) == {"cancelled"}
    assert not Timer.objects.filter(run__parent_id=run.pk, status="pending").exists()
    assert events(run) == [("force_failed", "carol")]
    with pytest.raises(durable.RunFinished):
        durable.force_fail(run.pk)


def test_force_fail_takes_the_run_from_the_worker_advancing_it():
    run = durable.start("tests.three_steps")
    claim = workpool.claim(worker="w", queues=None, db="default")
    durable.force_fail(run.pk)
    assert advance(claim) == "lost"  # its first checkpoint is fenced out
    run = run_of(run)
    assert run.status == "failed" and not Step.objects.filter(run=run).exists()


# -- skip a step, edit a result --------------------------------------------------------------------


def test_skip_a_failed_step_records_its_result_and_goes_on(flag):
    run = durable.start("tests.flaky_middle", str(flag))
    drain()
    durable.skip_step(run.pk, "b", "patched", by="dan")  # the flag is still there: b is never called
    drain()
    run = run_of(run)
    assert run.status == "completed" and run.get_result() == ["a", "patched", "c"]
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}
    assert events(run) == [("step_skipped", "dan"), ("attempt_ended", "")]  # the failed run's error is kept
    event = WorkflowEvent.objects.get(run_id=run.pk, type="step_skipped")
    assert (event.type, event.actor, event.data["key"]) == ("step_skipped", "dan", "b")
    assert "is broken while broken exists" in event.data["previous"]["error"]
    ended = WorkflowEvent.objects.get(run_id=run.pk, type="attempt_ended").data
    assert (ended["status"], ended["error"]["type"]) == ("failed", "django_durable.exceptions.StepFailed")


def test_skip_a_wait_for_a_signal_that_will_not_come():
    run = durable.start("tests.approval")
    drain()
    durable.skip_step(run.pk, "signal:approved:0", {"approved": True})
    assert not Timer.objects.filter(run=run, status="pending").exists()
    drain()
    assert run_of(run).get_result() == {"approved": True}


def test_skip_a_step_waiting_out_its_back_off():
    run = durable.start("tests.retry_after_backoff", 3600)
    drain()
    assert Step.objects.get(run=run, key="call").status == "retrying"
    durable.skip_step(run.pk, "call", "skipped")
    drain()
    assert run_of(run).get_result() == "skipped"
    assert ledger_counts(run.pk) == {"call": 1}
    assert Timer.objects.get(run=run, kind="retry").status == "cancelled"


def test_skip_a_branch_waiting_out_its_back_off_completes_the_group():
    run = durable.start("tests.slow_branch")
    drain()
    assert Step.objects.get(run=run, key="flaky").status == "retrying"
    assert run_of(run).status == "waiting"
    durable.skip_step(run.pk, "flaky", "skipped")
    assert WorkItem.objects.get(run=run, step_key="flaky").status == "completed"
    drain()
    assert run_of(run).get_result() == ["ok", "skipped"]
    assert ledger_counts(run.pk) == {"ok": 1, "flaky": 1}
    with pytest.raises(durable.RunFinished):
        durable.skip_step(run.pk, "flaky", 1)


def test_skip_ahead_records_a_step_the_run_has_not_reached():
    run = durable.start("tests.two_signals")
    drain()
    durable.skip_step(run.pk, "between", "pre-recorded")
    durable.signal(run.pk, "go", 1)
    durable.signal(run.pk, "go", 2)
    drain()
    assert run_of(run).get_result() == [1, 2]
    assert ledger_counts(run.pk) == {}  # "between" never ran


def test_skip_refuses_completed_steps_and_groups():
    run = durable.start("tests.edited")
    drain()
    with pytest.raises(durable.InvalidTransition, match="already completed"):
        durable.skip_step(run.pk, "a", 2)
    with pytest.raises(ValueError):
        durable.skip_step(run.pk, "", 2)
    with pytest.raises(durable.NotSerializable):
        durable.skip_step(run.pk, "x", object())
    assert events(run) == []


def test_edit_a_step_result_changes_what_later_replays_see():
    run = durable.start("tests.edited")
    drain()
    step = durable.edit_step_result(run.pk, "a", 41, by="erin")
    assert step.get_result() == 41
    durable.signal(run.pk, "go")
    drain()
    assert run_of(run).get_result() == 41
    event = WorkflowEvent.objects.get(run_id=run.pk)
    assert (event.type, event.data["old"], event.data["new"]) == ("step_edited", "1", "41")


def test_edit_refuses_unfinished_steps_and_a_run_a_worker_holds():
    run = durable.start("tests.edited")
    drain()
    with pytest.raises(durable.StepNotFound):
        durable.edit_step_result(run.pk, "nope", 1)
    with pytest.raises(durable.InvalidTransition, match="skip it"):
        durable.edit_step_result(run.pk, "signal:go:0", 1)
    durable.signal(run.pk, "go")
    workpool.claim(worker="w", queues=None, db="default")
    with pytest.raises(durable.InvalidTransition, match="advancing"):
        durable.edit_step_result(run.pk, "a", 2)


# -- wake, duplicate, release, start, signal --------------------------------------------------------


def test_wake_ends_a_sleep_now():
    run = durable.start("tests.sleeper", 3600)
    drain()
    assert durable.wake(run.pk, by="fay") == 1
    drain()
    assert run_of(run).status == "completed"
    assert events(run) == [("woken", "fay")]
    with pytest.raises(durable.RunFinished):
        durable.wake(run.pk)


def test_wake_leaves_timeouts_alone_unless_named():
    run = durable.start("tests.approval", timeout=3600)
    drain()
    with pytest.raises(durable.InvalidTransition, match="no pending timer"):
        durable.wake(run.pk)
    timer = Timer.objects.get(run=run, status="pending")
    assert durable.wake(run.pk, timer.pk) == 1
    drain()
    assert run_of(run).get_result() == "timed out"


def test_duplicate_starts_a_new_run_with_the_same_input():
    run = durable.start("tests.three_steps", x=5)
    drain()
    copy = durable.duplicate(run.pk, by="gus")
    assert copy.pk != run.pk and copy.get_input() == run_of(run).get_input()
    drain()
    assert run_of(copy).get_result() == [5, 6, 7]
    assert events(copy) == [("duplicated", "gus")] and events(run) == [("duplicated", "gus")]


def test_release_claim_returns_an_item_to_the_queue_and_fences_its_worker():
    run = durable.start("tests.three_steps")
    claim = workpool.claim(worker="hung", queues=None, db="default")
    assert durable.release_claim(claim.item_id, by="hal")
    assert not durable.release_claim(claim.item_id)  # no longer claimed
    assert advance(claim) == "lost"
    drain()
    assert run_of(run).status == "completed"
    # The released worker ran step a but could not record it: a runs again, nothing after it did.
    assert ledger_counts(run.pk) == {"a": 2, "b": 1, "c": 1}
    assert events(run) == [("claim_released", "hal")]


def test_start_run_and_signal_by_someone_are_audited():
    run = durable.start_run("tests.approval", [], {"timeout": None}, by="ivy")
    durable.signal(run.pk, "approved", "yes", by="ivy")
    durable.signal(run.pk, "approved", "no")  # code, not a person: not audited
    assert events(run) == [("started", "ivy"), ("signal_sent", "ivy")]
    with pytest.raises(TypeError):
        durable.start_run("tests.approval", {"timeout": 1})
    with pytest.raises(durable.WorkflowNotFound):
        durable.start_run("os.system", ["ls"])
