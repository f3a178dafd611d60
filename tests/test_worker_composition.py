"""Composition with real worker processes: a fan-out shared by two workers, a rollback across a crash."""

import signal

import pytest

import django_durable as durable
from django_durable.models import Step, WorkflowRun, WorkItem
from tests.conftest import assert_settled, ledger_counts, wait_for
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.postgres
def test_a_map_over_200_items_is_shared_by_two_worker_processes(start_worker):
    run = durable.start("tests.map_pids", 200)
    worker = start_worker(concurrency=2)
    assert worker.wait(120) == 0, worker.log()
    pids = durable.wait(run.pk, timeout=1)
    assert len(pids) == 200
    executions = [(step, pid) for run_id, step, pid in ledger.entries() if run_id == str(run.pk)]
    assert sorted(step for step, _ in executions) == sorted(f"square:{i}" for i in range(200))  # each once
    assert len(set(pids)) == 2  # both workers ran branches
    results = Step.objects.filter(run=run, key__startswith="m:")
    assert results.count() == 200
    assert WorkItem.objects.filter(run=run, kind="step", status="completed").count() == 200
    assert_settled()


def test_map_results_come_back_in_input_order_from_a_worker(start_worker):
    run = durable.start("tests.map_squares", 30)
    worker = start_worker(concurrency=2)
    assert worker.wait(120) == 0, worker.log()
    assert durable.wait(run.pk, timeout=1) == [i * i for i in range(30)]


def test_a_rollback_interrupted_by_sigkill_resumes_without_repeating_a_compensation(start_worker):
    """Saga: charge, reserve, ship fails; release then refund, each once, across a crash."""
    run = durable.start("tests.saga_auto", block=None)
    # Kill the worker right after the first compensation (release) was recorded.
    first = start_worker(faults="after_checkpoint_commit=kill@rollback:reserve")
    assert first.wait() == -signal.SIGKILL
    assert ledger_counts(run.pk) == {"charge": 1, "reserve": 1, "ship": 1, "release": 1}
    assert Step.objects.get(run=run, key="rollback:reserve").status == "completed"

    second = start_worker()
    assert second.wait() == 0, second.log()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "failed" and "no courier" in run.get_error()["message"]
    assert ledger_counts(run.pk) == {"charge": 1, "reserve": 1, "ship": 1, "release": 1, "refund": 1}
    order = [step for run_id, step, _ in ledger.entries() if run_id == str(run.pk)]
    assert order == ["charge", "reserve", "ship", "release", "refund"]
    assert_settled()


def test_cancelling_a_parent_in_a_worker_cancels_its_children(start_worker):
    run = durable.start("tests.waiting_parent")
    worker = start_worker(burst=False)
    wait_for(lambda: WorkflowRun.objects.filter(parent=run, status="waiting").count() == 2, message="the children")
    durable.cancel(run.pk)
    wait_for(lambda: WorkflowRun.objects.filter(status="cancelled").count() == 3, message="all cancelled")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert_settled()
