"""Promises a durable engine keeps under faults, with real worker processes.

A lost claim never kills a worker; a finished parent leaves no child running; the first of a
timeout and a message wins by the database's clock; no sleep, back-off or timeout ends early;
a cancel reaches a running step; code missing in a worker waits for one that has it.
"""

import signal

import pytest

import django_durable as durable
from django_durable.models import WorkflowRun
from tests.conftest import assert_settled, ledger_counts

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
    import threading

    from django.db import connections

    from django_durable.models import WorkItem

    locked = threading.Event()

    def hold():
        try:
            from django.db import transaction

            with transaction.atomic():
                list(WorkflowRun.objects.select_for_update().filter(pk__in=[r.pk for r in runs]))
                locked.set()
                # Until every worker's claim statement is blocked on a row (or the time is up).
                import time

                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    time.sleep(0.05)
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
    from django.db import connection

    from tests.testapp import ledger

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
