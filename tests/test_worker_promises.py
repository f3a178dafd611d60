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
