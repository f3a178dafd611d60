"""Code a worker does not have (a rolling deploy): the run waits for a worker that has it, then fails."""

import datetime as dt

import pytest

import django_durable as durable
from django_durable import registry, workpool
from django_durable.engine.branches import run_branch
from django_durable.engine.replay import advance
from django_durable.models import WorkflowRun, WorkItem
from django_durable.testing import clock, drain
from tests.conftest import ledger_counts
from tests.testapp import workflows

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


@pytest.fixture
def without_workflow(monkeypatch):
    """This process, like a worker of the previous release, does not have tests.three_steps."""
    monkeypatch.delitem(registry._registry, "tests.three_steps")


def claim():
    return workpool.claim(worker="old-release", queues=None, db="default")


def test_a_run_whose_workflow_this_worker_lacks_is_left_for_another_and_not_counted(without_workflow, monkeypatch):
    run = durable.start(workflows.three_steps, x=1)
    assert advance(claim()) == "deferred"
    item = WorkItem.objects.get(run=run)
    assert (item.status, item.attempts, item.claim_token) == ("pending", 0, None)  # not a lost delivery
    assert item.available_at > dt.datetime.now(dt.timezone.utc)  # not offered again at once
    assert item.missing_since is not None
    assert run_of(run).status == "pending"
    assert run_of(run).waiting_on == "a worker that has workflow 'tests.three_steps'"
    # A worker of the new release has it and runs it.
    monkeypatch.setitem(registry._registry, "tests.three_steps", workflows.three_steps.durable_workflow)
    WorkItem.objects.filter(pk=item.pk).update(available_at=item.created_at)
    drain()
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]
    assert not WorkItem.objects.filter(run=run).exists()  # the stamp went with the item at the run's end


def test_past_the_grace_the_run_fails_naming_the_missing_workflow(without_workflow, settings):
    settings.DURABLE_MISSING_CODE_GRACE_SECONDS = 60
    with clock() as test_clock:
        run = durable.start(workflows.three_steps, x=1)
        assert advance(claim()) == "deferred"
        test_clock.advance(seconds=30)
        assert advance(claim()) == "deferred"  # still within the grace, counted from the first miss
        test_clock.advance(seconds=31)
        assert advance(claim()) == "failed"
    run = run_of(run)
    assert run.status == "failed"
    error = run.get_error()
    assert error["type"] == "django_durable.exceptions.WorkflowNotFound"
    assert "'tests.three_steps'" in error["message"] and "DURABLE_MISSING_CODE_GRACE_SECONDS" in error["message"]


def test_a_branch_whose_function_this_worker_lacks_waits_for_one_that_has_it(monkeypatch, settings):
    settings.DURABLE_MISSING_CODE_GRACE_SECONDS = 60
    with clock() as test_clock:
        run = durable.start("tests.squares", 1)
        advance(claim())  # queues the branch
        square = workflows.square
        monkeypatch.delattr(workflows, "square")
        assert run_branch(claim()) == "deferred"
        item = WorkItem.objects.get(run=run, kind="step")
        assert (item.status, item.attempts) == ("pending", 0)
        monkeypatch.setattr(workflows, "square", square, raising=False)
        test_clock.advance(seconds=10)
        drain()
    assert [r["square"] for r in durable.wait(run.pk, timeout=1)] == [0]
    assert ledger_counts(run.pk) == {"square:0": 1}


def test_past_the_grace_the_branch_fails_naming_its_function(monkeypatch, settings):
    settings.DURABLE_MISSING_CODE_GRACE_SECONDS = 60
    with clock() as test_clock:
        run = durable.start("tests.squares", 1)
        advance(claim())
        square = workflows.square
        monkeypatch.delattr(workflows, "square")
        assert run_branch(claim()) == "deferred"
        test_clock.advance(seconds=61)
        assert run_branch(claim()) == "failed"
        monkeypatch.setattr(workflows, "square", square, raising=False)  # the workflow's own code needs it
        drain()
    run = run_of(run)
    assert run.status == "failed"
    assert "tests.testapp.workflows.square" in run.get_error()["message"]


def test_a_worker_that_declined_an_item_lets_a_worker_with_the_code_take_it_first(without_workflow, monkeypatch):
    """A rolling deploy: the old worker does not race the new one for the run it just handed back."""
    from django_durable.worker import Worker

    run = durable.start(workflows.three_steps, x=1)
    old = Worker(name="old-release", burst=True)
    assert old._run_once()  # claimed, and handed back: it lacks the workflow
    item = WorkItem.objects.get(run=run)
    assert item.status == "pending" and item.missing_since is not None
    WorkItem.objects.filter(pk=item.pk).update(available_at=item.created_at)  # its delay is over
    assert not old._run_once()  # the old worker leaves it alone a while...
    assert WorkItem.objects.get(pk=item.pk).status == "pending"
    monkeypatch.setitem(registry._registry, "tests.three_steps", workflows.three_steps.durable_workflow)
    new = workpool.claim(worker="new-release", queues=None, db="default")
    assert new is not None and new.item_id == item.pk  # ...and the new one takes it
    assert advance(new) == "completed"
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]
    old._declined = {item.pk: 0.0}  # once its turn is over, the old worker may claim it again
    assert old._avoid() == ()
