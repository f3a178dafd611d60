"""Promises a durable engine keeps under faults, with real worker processes.

A lost claim never kills a worker; a finished parent leaves no child running; the first of a
timeout and a message wins by the database's clock; no sleep, back-off or timeout ends early;
a cancel reaches a running step; code missing in a worker waits for one that has it.
"""

import signal
import threading
import time

import pytest
from django.db import connection, connections, transaction

import django_durable as durable
from django_durable.models import WorkflowRun, WorkItem
from tests.conftest import assert_settled, ledger_counts, wait_for
from tests.testapp import ledger
from tests.testapp.models import Payment

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


def test_a_branch_claim_stalled_past_its_lease_is_abandoned_and_the_worker_goes_on(start_worker, tmp_path):
    """A lone worker paused after claiming a branch, until its lease lapsed, logs the loss once,
    never starts the branch under the lost claim, and keeps working."""
    run = durable.start("tests.squares", 2)
    stalled = tmp_path / "stalled"
    # Lease 2 s: stalled 4 s right after the claim commits, the item is reaped meanwhile.
    worker = start_worker(burst=False, faults=f"after_claim_commit=once:{stalled}+sleep:4@sq:0")
    assert [r["square"] for r in durable.wait(run.pk, timeout=60)] == [0, 1]
    assert stalled.exists()
    later = durable.start("tests.three_steps", x=1)
    assert durable.wait(later.pk, timeout=30) == [1, 2, 3]
    assert worker.running(), worker.log()
    log = worker.log()
    assert log.count("lost its claim") == 1, log
    assert "lost its claim on branch 'sq:0'" in log
    assert "Traceback" not in log, log
    assert ledger_counts(run.pk) == {"square:0": 1, "square:1": 1}  # never run under the lost claim
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
    assert_settled()


# -- no sleep, back-off or timeout ends early -------------------------------------------------------------


def _hold_run_rows(runs, seconds):
    """Lock the runs' rows for `seconds` from another connection, so that the claims that reach
    them wait that long between their statement's timestamp and their answer (PostgreSQL)."""
    locked = threading.Event()

    def hold():
        try:
            with transaction.atomic():
                list(WorkflowRun.objects.select_for_update().filter(pk__in=[r.pk for r in runs]))
                locked.set()
                time.sleep(seconds)  # the workers' claim statements wait on these rows meanwhile
        finally:
            locked.set()
            connections.close_all()

    thread = threading.Thread(target=hold)
    thread.start()
    locked.wait(10)
    return thread


def test_no_sleep_backoff_or_timeout_ends_before_its_time_on_the_database_clock(start_worker, cpu_hog):
    """Measured inside the steps, on the database's clock, with a busy machine and (on PostgreSQL)
    claim statements held up between their timestamp and their answer."""
    sleep = durable.start("tests.measured_sleep", 1.0)
    backoff = durable.start("tests.measured_backoff", 0.5)
    timeout = durable.start("tests.measured_timeout", 0.7)
    holder = None
    if connection.vendor == "postgresql":
        holder = _hold_run_rows([sleep, backoff, timeout], 0.8)
    worker = start_worker(concurrency=3, burst=False)
    if holder is not None:
        holder.join(timeout=30)
    before, after = durable.wait(sleep.pk, timeout=60)
    assert (after - before).total_seconds() >= 1.0, (before, after)
    before, after = durable.wait(timeout.pk, timeout=60)
    assert (after - before).total_seconds() >= 0.7, (before, after)
    assert durable.wait(backoff.pk, timeout=60) == "ok"
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
    attempts = sorted(float(step.split("@")[1]) for run_id, step, _ in ledger.entries() if run_id == str(backoff.pk))
    assert len(attempts) == 2 and attempts[1] - attempts[0] >= 0.5, attempts
    assert_settled()


# -- a cancel reaches a running step ---------------------------------------------------------------------


GRACE = {"DURABLE_CANCEL_GRACE_SECONDS": "1"}


def _cancel_when_reached(run, reached, timeout=30):
    wait_for(reached.exists, timeout=timeout, message="the step to start")
    assert durable.cancel(run.pk, reason="stop").cancel_requested_at is not None


@pytest.mark.parametrize("workflow", [
    "tests.long_step",
    # On SQLite an atomic step holds the only write lock: not even the cancel can be stored.
    pytest.param("tests.long_atomic_step", marks=pytest.mark.postgres),
])
def test_a_cancel_interrupts_a_running_step_after_the_grace(start_worker, tmp_path, workflow):
    """A 30-second step (one blocking call) is interrupted about a second after the cancel; the
    run ends cancelled, no later step starts, an atomic step's writes roll back, the worker goes on."""
    reached = tmp_path / "reached"
    run = durable.start(workflow, str(reached))
    worker = start_worker(burst=False, env=GRACE)
    _cancel_when_reached(run, reached)
    with pytest.raises(durable.WorkflowFailed, match="cancelled"):
        durable.wait(run.pk, timeout=20)  # the step alone would take 30 s
    assert ledger_counts(run.pk).get("long:end") is None  # it never ran to its end
    assert "never" not in ledger_counts(run.pk)
    assert not run_of(run).steps.filter(key="long", status="completed").exists()
    if workflow == "tests.long_atomic_step":
        assert Payment.objects.filter(run_id=run.pk).count() == 1  # the first atomic step, not the long one
    later = durable.start("tests.three_steps", x=1)
    assert durable.wait(later.pk, timeout=30) == [1, 2, 3]
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
    assert_settled()


def test_a_step_that_is_not_cancellable_runs_to_its_end(start_worker, tmp_path):
    reached = tmp_path / "reached"
    run = durable.start("tests.long_step", str(reached), seconds=3, cancellable=False)
    worker = start_worker(burst=False, env=GRACE)
    _cancel_when_reached(run, reached)
    with pytest.raises(durable.WorkflowFailed, match="cancelled"):
        durable.wait(run.pk, timeout=30)
    assert ledger_counts(run.pk) == {"long:start": 1, "long:end": 1}  # finished, and nothing after it
    assert run_of(run).steps.get(key="long").status == "completed"
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def test_a_step_may_notice_the_cancel_within_the_grace(start_worker, tmp_path):
    reached = tmp_path / "reached"
    run = durable.start("tests.polite_step", str(reached))
    worker = start_worker(burst=False, env={"DURABLE_CANCEL_GRACE_SECONDS": "60"})
    _cancel_when_reached(run, reached)
    with pytest.raises(durable.WorkflowFailed, match="cancelled"):
        durable.wait(run.pk, timeout=30)  # far less than the 60 s grace: the step stopped itself
    assert run_of(run).steps.get(key="polite").get_result() == "noticed"
    assert "never" not in ledger_counts(run.pk)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def test_compensations_still_run_after_a_step_is_interrupted_by_a_cancel(start_worker, tmp_path):
    reached = tmp_path / "reached"
    run = durable.start("tests.long_saga", str(reached))
    worker = start_worker(burst=False, env=GRACE)
    _cancel_when_reached(run, reached)
    with pytest.raises(durable.WorkflowFailed, match="cancelled"):
        durable.wait(run.pk, timeout=20)
    assert ledger_counts(run.pk) == {"charge": 1, "long:start": 1, "refund": 1}
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()


def test_a_cancel_interrupts_running_parallel_branches(start_worker, tmp_path):
    reached = tmp_path / "reached"
    run = durable.start("tests.long_branches", str(reached))
    worker = start_worker(burst=False, concurrency=2, env=GRACE)
    _cancel_when_reached(run, reached)
    with pytest.raises(durable.WorkflowFailed, match="cancelled"):
        durable.wait(run.pk, timeout=20)
    # Both branches are interrupted and let go of their claims long before their 30 s.
    wait_for(lambda: not run_of(run).work_items.filter(status="processing").exists(), timeout=15,
             message="the branches to let go")
    assert "branch0:end" not in ledger_counts(run.pk) and "branch1:end" not in ledger_counts(run.pk)
    later = durable.start("tests.three_steps", x=1)
    assert durable.wait(later.pk, timeout=30) == [1, 2, 3]
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
    assert_settled()


# -- a rolling deploy: code one worker does not have --------------------------------------------------------


def test_during_a_rolling_deploy_a_run_waits_for_a_worker_that_has_its_workflow(start_worker):
    run = durable.start("tests.new_release")
    old = start_worker("--name", "old", burst=False, env={"DURABLE_TEST_OLD_RELEASE": "1"})
    wait_for(lambda: "does not have workflow 'tests.new_release'" in old.log(), timeout=30,
             message="the old worker to pass the run on")
    assert run_of(run).status == "pending"
    assert WorkItem.objects.get(run=run).attempts == 0  # not counted as a lost delivery
    new = start_worker("--name", "new", burst=False)
    assert durable.wait(run.pk, timeout=30) == "new"
    assert ledger_counts(run.pk) == {"new": 1}
    assert old.running(), old.log()
    for worker in (old, new):
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.log()
    assert_settled()
