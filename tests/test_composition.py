"""Parallel branches, child workflows and compensation, in-process."""

import datetime as dt

import pytest

import django_durable as durable
from django_durable import ids
from django_durable.models import Step, WorkflowRun, WorkItem
from django_durable.testing import clock, drain
from tests.conftest import ledger_counts, replay_again
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


# -- parallel branches --------------------------------------------------------------------------


def test_parallel_branches_run_as_work_items_and_return_in_order():
    run = durable.start("tests.squares", 6)
    drain()
    run = run_of(run)
    assert [r["square"] for r in run.get_result()] == [0, 1, 4, 9, 16, 25]
    assert ledger_counts(run.pk) == {f"square:{i}": 1 for i in range(6)}
    items = WorkItem.objects.filter(run=run, kind="step")
    assert sorted(items.values_list("step_key", flat=True)) == sorted(f"sq:{i}" for i in range(6))
    assert set(items.values_list("status", flat=True)) == {"completed"}
    group = Step.objects.get(run=run, key="sq")
    assert (group.kind, group.status, group.remaining) == ("parallel", "completed", 0)


def test_map_applies_a_function_to_each_item():
    run = durable.start("tests.map_squares", 5)
    drain()
    assert run_of(run).get_result() == [0, 1, 4, 9, 16]


def test_the_run_waits_without_a_worker_and_is_advanced_once_when_the_group_is_done():
    run = durable.start("tests.squares", 4)
    from django_durable import workpool
    from django_durable.engine.branches import run_branch
    from django_durable.engine.replay import advance

    advance(workpool.claim(worker="w", queues=None, db="default"))  # spawns the branches
    run = run_of(run)
    assert run.status == "waiting" and run.waiting_on == "parallel 'sq': 0 of 4 branches done"
    advance_item = WorkItem.objects.get(run=run, kind="advance")
    for _ in range(3):
        run_branch(workpool.claim(worker="w", queues=None, db="default"))
        assert WorkItem.objects.get(pk=advance_item.pk).status == "completed"  # not woken yet
    run_branch(workpool.claim(worker="w", queues=None, db="default"))
    assert WorkItem.objects.get(pk=advance_item.pk).status == "pending"  # the last branch woke it
    drain()
    assert run_of(run).status == "completed"


def test_a_branch_that_fails_for_good_fails_fast_and_cancels_the_rest():
    run = durable.start("tests.fail_fast", 5, 0)  # the first branch is the bad one
    drain()
    run = run_of(run)
    assert run.status == "failed"
    error = run.get_error()
    assert error["type"] == "django_durable.exceptions.StepFailed" and "item 0 is bad" in error["message"]
    assert ledger_counts(run.pk) == {"item:0": 1}  # no other branch started after the failure
    statuses = dict(WorkItem.objects.filter(run=run, kind="step").values_list("step_key", "status"))
    assert statuses == {"item:0": "completed", **{f"item:{i}": "cancelled" for i in range(1, 5)}}


def test_a_retried_run_never_runs_a_completed_branch_again():
    with clock() as frozen:
        run = durable.start("tests.retried_fan_out", 4, 3)  # branch 3 fails the run's first attempt
        drain()
        assert run_of(run).status == "waiting"  # the run's back-off
        frozen.advance(seconds=5)
        drain()
    run = run_of(run)
    assert run.status == "completed", run.error
    assert run.get_result() == [0, 1, 2, 3]
    assert ledger_counts(run.pk) == {"item:0": 1, "item:1": 1, "item:2": 1, "item:3": 2}


def test_return_exceptions_collects_failures_with_the_results():
    run = durable.start("tests.fail_fast", 4, 2, collect=True)
    drain()
    assert run_of(run).get_result() == [0, 1, "failed: item 2 is bad", 3]


flaky_calls = {}


def flaky_branch(run_id, key):
    flaky_calls[key] = flaky_calls.get(key, 0) + 1
    if flaky_calls[key] == 1:
        raise ConnectionError("first attempt fails")
    return durable.current_step().attempt


@durable.workflow("tests.composition.retried_branch")
def retried_branch(ctx):
    return ctx.parallel([ctx.call("b", flaky_branch, ctx.run_id, "b",
                                  retry=durable.RetryPolicy(max_attempts=2, initial_backoff=0))])


def test_a_branch_is_retried_under_its_own_policy():
    run = durable.start(retried_branch)
    drain()
    assert run_of(run).get_result() == [2]
    assert Step.objects.get(run=run, key="b").attempts == 2


@durable.workflow("tests.composition.lambda_branch")
def lambda_branch(ctx):
    return ctx.parallel([ctx.call("x", lambda: 1)])


def test_a_branch_must_be_a_module_level_function():
    run = durable.start(lambda_branch)
    drain()
    assert "cannot run as a parallel branch" in run_of(run).get_error()["message"]


def test_an_empty_parallel_returns_at_once():
    @durable.workflow("tests.composition.empty")
    def empty(ctx):
        return ctx.map("none", print, [])

    run = durable.start(empty)
    drain()
    assert run_of(run).get_result() == []


# -- child workflows ------------------------------------------------------------------------------


def test_child_results_failures_and_handles():
    run = durable.start("tests.parent")
    drain()
    run = run_of(run)
    assert run.status == "completed", run.error
    result = run.get_result()
    assert result["sum"] == 5 and result["later"] == 30
    assert "no courier" in result["caught"]
    children = WorkflowRun.objects.filter(parent=run)
    assert sorted(children.values_list("workflow", "status")) == [
        ("tests.child_adder", "completed"), ("tests.child_adder", "completed"), ("tests.child_breaker", "failed")
    ]
    from django_durable import ids

    assert {c.pk for c in children} == {ids.child_id(run.pk, key) for key in ("sum", "later", "broken")}
    # Each child's id carries its parent's time: where runs are partitioned, a family shares one.
    assert {ids.millis(c.pk) for c in children} == {ids.millis(run.pk)}


def test_a_replay_never_starts_a_child_twice():
    run = durable.start("tests.parent")
    drain()
    child_ids = set(WorkflowRun.objects.filter(parent=run).values_list("pk", flat=True))
    Step.objects.filter(run=run, key="later").delete()  # as if the parent crashed before recording it
    replay_again(run.pk, result=None)
    drain()
    assert set(WorkflowRun.objects.filter(parent=run).values_list("pk", flat=True)) == child_ids
    assert run_of(run).get_result()["later"] == 30


def test_a_child_started_again_after_it_ended_is_returned_as_it_is_with_nothing_queued():
    """A replay that starts a child again (its parent crashed before recording the start) gets the
    child back as it is. One that has ended has no work item (its end deleted it), and none is made."""
    from django_durable import registry
    from django_durable.workpool.runs import create_run

    run = durable.start("tests.parent")
    drain()
    child = WorkflowRun.objects.filter(parent=run, status="completed").first()
    assert not WorkItem.objects.filter(run=child).exists()
    arguments = child.get_input()
    again = create_run(registry.get(child.workflow), arguments["args"], arguments["kwargs"], run_id=child.pk,
                       parent_id=run.pk)
    assert again.pk == child.pk and run_of(again).status == "completed"
    assert not WorkItem.objects.filter(run=child).exists()


def _parent_made_at(moment):
    """A run of tests.parent whose id carries `moment` (as one made then would)."""
    from django_durable import registry
    from django_durable.workpool.runs import create_run

    millis = int((moment - ids.EPOCH).total_seconds() * 1000)
    return create_run(registry.get("tests.parent"), [], {}, run_id=ids._with_time(millis, 7, 12345))


def test_a_parent_from_before_the_new_ids_keeps_the_child_it_started_under_its_old_id():
    # A build before 2026-11-25 started the child "later" as uuid5(parent, key), then crashed
    # before recording it: the replay under the new code finds that child and starts no other.
    from django_durable import registry
    from django_durable.workpool.runs import create_run

    parent = _parent_made_at(ids.LEGACY_CHILDREN_BEFORE - dt.timedelta(days=3))
    old = create_run(registry.get("tests.child_adder"), [10, 20], {}, run_id=ids.legacy_child_id(parent.pk, "later"),
                     parent_id=parent.pk)
    drain()
    children = dict(WorkflowRun.objects.filter(parent=parent).values_list("pk", "workflow"))
    assert old.pk in children and ids.child_id(parent.pk, "later") not in children, children
    assert len(children) == 3 and run_of(parent).get_result()["later"] == 30


def test_a_workflow_may_start_itself_recursively():
    with clock() as test_clock:
        run = durable.start("tests.recursive")
        for _ in range(40):
            drain()
            if run_of(run).status == "completed":
                break
            test_clock.advance(seconds=1)
    assert run_of(run).get_result() == {"count": 10}
    assert WorkflowRun.objects.count() == 10


def test_cancelling_a_parent_cancels_its_children():
    run = durable.start("tests.waiting_parent")
    drain()
    children = WorkflowRun.objects.filter(parent=run)
    assert sorted(children.values_list("status", flat=True)) == ["waiting", "waiting"]
    durable.cancel(run.pk)
    assert set(children.values_list("status", flat=True)) == {"cancelled"}
    assert run_of(run).status == "cancelled"


# -- compensation ------------------------------------------------------------------------------


def test_rollback_runs_the_compensations_in_reverse_order_once_each():
    run = durable.start("tests.saga")
    drain()
    run = run_of(run)
    assert run.get_result() == {"rolled_back": True, "charge": {"charge_id": "ch_10"}}
    entries = [line[1] for line in ledger.entries() if line[0] == str(run.pk)]
    assert entries == ["charge", "reserve", "ship", "release", "refund"]
    rollback = list(Step.objects.filter(run=run, kind="rollback").order_by("seq").values_list("key", flat=True))
    assert rollback == ["rollback:reserve", "rollback:charge"]


def test_compensate_on_failure_rolls_back_then_ends_failed():
    run = durable.start("tests.saga_auto")
    drain()
    run = run_of(run)
    assert run.status == "failed"
    assert "no courier" in run.get_error()["message"]
    entries = [line[1] for line in ledger.entries() if line[0] == str(run.pk)]
    assert entries == ["charge", "reserve", "ship", "release", "refund"]


def test_a_failing_compensation_leaves_compensation_failed_and_retry_rollback_finishes_it():
    run = durable.start("tests.saga_auto", release_fails=1)
    drain()
    run = run_of(run)
    assert run.status == "compensation_failed"
    assert "the warehouse is down" in run.get_error()["message"]
    assert ledger_counts(run.pk) == {"charge": 1, "reserve": 1, "ship": 1, "release": 1}  # refund not yet
    durable.retry_rollback(run.pk)
    drain()
    run = run_of(run)
    assert run.status == "failed"
    assert ledger_counts(run.pk) == {"charge": 1, "reserve": 1, "ship": 1, "release": 2, "refund": 1}
    with pytest.raises(durable.InvalidTransition, match="not compensation_failed"):
        durable.retry_rollback(run.pk)


def test_compensate_on_cancel_rolls_back_then_ends_cancelled():
    run = durable.start("tests.saga_on_cancel")
    drain()
    assert run_of(run).status == "waiting"
    durable.cancel(run.pk, reason="customer changed their mind")
    assert run_of(run).status == "waiting"  # a worker must run the compensations first
    drain()
    run = run_of(run)
    assert run.status == "cancelled"
    assert ledger_counts(run.pk) == {"charge": 1, "refund": 1}


def test_current_step_tells_a_step_about_itself():
    @durable.workflow("tests.composition.info")
    def info(ctx):
        return ctx.step("who", lambda: durable.current_step().__dict__)

    run = durable.start(info)
    drain()
    result = run_of(run).get_result()
    assert result == {"run_id": run.pk, "workflow": "tests.composition.info", "key": "who", "attempt": 1}
    assert durable.current_step() is None


def test_a_branch_past_its_timeout_is_interrupted():
    import time

    run = durable.start("tests.branch_timeouts")
    started = time.monotonic()
    drain()
    assert time.monotonic() - started < 20  # (not interrupted, the slow branch naps 30 s)
    assert run_of(run).get_result() == [0, "django_durable.exceptions.StepTimeout"]
    assert Step.objects.get(run=run, key="slow").deadline_at is not None


# -- a finished parent leaves no child running ------------------------------------------------------------


def children_of(run):
    return {key: WorkflowRun.objects.get(pk=durable_child_id(run, key)) for key in
            Step.objects.filter(run_id=run.pk, kind="child").values_list("key", flat=True)}


def durable_child_id(run, key):
    return ids.child_id(run.pk, key)


def test_a_failed_parent_cancels_its_unfinished_children_recursively_but_not_detached_ones():
    run = durable.start("tests.failing_parent")
    drain()
    assert {child.status for child in children_of(run).values()} == {"waiting"}
    durable.signal(run.pk, "fail")
    drain()
    assert run_of(run).status == "failed"
    kids = children_of(run)
    assert kids["kid"].status == "cancelled"
    assert f"Its parent run {run.pk} ended failed" in kids["kid"].get_error()["message"]
    grandchildren = children_of(kids["kid"])
    assert {key: child.status for key, child in grandchildren.items()} == {"a": "cancelled", "b": "cancelled"}
    # Nothing of the cancelled tree can wake any more.
    from django_durable.models import Timer

    assert not Timer.objects.filter(run_id__in=[c.pk for c in grandchildren.values()], status="pending").exists()
    assert kids["free"].status == "waiting" and kids["free"].detached  # started detached: it goes on
    durable.signal(kids["free"].pk, "approved", "yes")
    drain()
    assert durable.wait(kids["free"].pk, timeout=1) == "yes"


def test_a_timed_out_parent_cancels_its_children():
    with clock() as test_clock:
        run = durable.start("tests.parent_with_deadline")
        drain()
        assert children_of(run)["kid"].status == "waiting"
        test_clock.advance(seconds=61)
        drain()
    assert run_of(run).status == "timed_out"
    assert children_of(run)["kid"].status == "cancelled"


def test_a_parent_that_completes_leaves_the_child_it_did_not_wait_for_running():
    run = durable.start("tests.parent_leaves_child")
    drain()
    assert run_of(run).status == "completed"
    assert children_of(run)["kid"].status == "waiting"


def test_a_parent_failed_as_poison_cancels_its_children(settings):
    from django_durable import workpool

    run = durable.start("tests.waiting_parent")
    drain()
    kids = children_of(run)
    assert {child.status for child in kids.values()} == {"waiting"}
    # Its worker died on it for the last time: the reaper fails it.
    durable.signal(run.pk, "nudge")  # ready again
    claim = workpool.claim(worker="doomed", queues=None, db="default")
    assert claim.run_id == run.pk
    WorkItem.objects.filter(pk=claim.item_id).update(attempts=settings.DURABLE_MAX_DELIVERIES,
                                                      claim_expires_at="2000-01-01T00:00:00Z")
    assert workpool.reap(db="default") == 1
    assert run_of(run).status == "failed"
    assert {key: child.status for key, child in children_of(run).items()} == {"a": "cancelled", "b": "cancelled"}


def test_a_held_child_gets_a_cancel_request_when_its_parent_fails():
    from django_durable import workpool
    from django_durable.engine.replay import advance

    run = durable.start("tests.parent_with_deadline")
    drain()
    kid = children_of(run)["kid"]
    durable.signal(kid.pk, "other")  # the child's item is ready again...
    held = workpool.claim(worker="w", queues=None, db="default")  # ...and a worker holds it
    assert held.run_id == kid.pk
    durable.force_fail(run.pk)
    kid = WorkflowRun.objects.get(pk=kid.pk)
    assert kid.status == "running" and kid.cancel_requested_at is not None
    advance(held)  # its worker knew nothing yet, but its item was flagged to come back...
    drain()
    assert WorkflowRun.objects.get(pk=kid.pk).status == "cancelled"  # ...and it ended at the next claim


@durable.workflow("tests.composition.awaits_approval_child")
def awaits_approval_child(ctx):
    try:
        return ctx.child("kid", "tests.approval")
    except durable.ChildFailed as failure:
        return {"child failed": failure.message}


def _poison(run_pk, settings):
    """As if the run's worker had died on it DURABLE_MAX_DELIVERIES times: claimed, its lease over."""
    from django_durable import workpool

    claim = workpool.claim(worker="doomed", queues=None, db="default")
    assert claim.run_id == run_pk
    WorkItem.objects.filter(pk=claim.item_id).update(attempts=settings.DURABLE_MAX_DELIVERIES,
                                                      claim_expires_at="2000-01-01T00:00:00Z")
    assert workpool.reap(db="default") == 1


def test_a_child_failed_as_poison_wakes_its_waiting_parent_with_child_failed(settings):
    """Issue 31: the reaper's ending is every ending: the parent waiting on the child is woken."""
    run = durable.start(awaits_approval_child)
    drain()
    kid = children_of(run)["kid"]
    durable.signal(kid.pk, "approved", {"by": "ann"})  # the child is ready again, and its worker dies
    _poison(kid.pk, settings)
    assert WorkflowRun.objects.get(pk=kid.pk).status == "failed"
    drain()
    parent = run_of(run)
    assert parent.status == "completed" and "worker was lost" in parent.get_result()["child failed"]


def test_a_run_failed_as_poison_has_its_timers_cancelled(settings):
    from django_durable.models import Timer

    run = durable.start("tests.approval", timeout=3600)  # a signal wait with a timeout: a timer
    drain()
    assert Timer.objects.filter(run=run, status="pending").count() == 1
    durable.signal(run.pk, "other")
    _poison(run.pk, settings)
    assert run_of(run).status == "failed"
    assert Timer.objects.filter(run=run, status="pending").count() == 0


# A poisoned task's run: test_endings.py::test_a_tasks_run_ends_with_task_finished_once[by_poison-FAILED].
