"""A database outage is not a lost worker (RELIABILITY T46); and a heartbeat that meets the end
its own worker just made says nothing.

The outage itself, with real worker processes and a server stopped as a crash stops it, is
tests/harness/outage.py.
"""

from __future__ import annotations

import logging
import time
import uuid
from types import SimpleNamespace

import pytest

import django_durable as durable
from django_durable import services, workpool
from django_durable.models import WorkflowRun, WorkItem
from django_durable.worker.maintenance import Maintenance
from tests import harness


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(400)
def test_an_outage_longer_than_the_lease_costs_no_delivery_no_storm_and_no_notification():
    done = harness.run("outage", timeout=360)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert "6 of 6 runs completed" in done.stdout, done.stdout
    assert "claims taken back as lost workers': 0" in done.stdout, done.stdout


def _heartbeat_due(claim) -> tuple[Maintenance, float]:
    """A worker's maintenance thread (not started) whose next heartbeat for `claim` is due now."""
    worker = SimpleNamespace(name=claim.worker, db="default", queues=None, processed=0)
    maintenance = Maintenance(worker)
    now = time.monotonic()
    maintenance.beats[claim.token] = now - maintenance.heartbeat - 1
    return maintenance, now


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_after_its_own_worker_ended_the_claim_says_nothing(caplog):
    durable.start("tests.three_steps", x=1)
    claim = workpool.claim(worker="w1", queues=None, db="default")
    maintenance, now = _heartbeat_due(claim)  # read as current just before the end...
    assert workpool.release(claim, run_status="pending")  # ...which then commits
    with caplog.at_level(logging.WARNING, logger="django_durable"):
        maintenance._beat(claim, now)
    assert not [r for r in caplog.records if "lost its claim" in r.getMessage()]


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_that_finds_its_claim_taken_says_so(caplog):
    durable.start("tests.three_steps", x=1)
    claim = workpool.claim(worker="w1", queues=None, db="default")
    maintenance, now = _heartbeat_due(claim)
    WorkItem.objects.filter(id=claim.item_id).update(claim_token=uuid.uuid4(), claimed_by="w2")  # reaped, taken
    with caplog.at_level(logging.WARNING, logger="django_durable"):
        maintenance._beat(claim, now)
    assert claim.lost
    assert [r for r in caplog.records if "lost its claim" in r.getMessage()]


@pytest.mark.django_db(transaction=True)
def test_a_claim_ended_by_its_own_end_is_told_from_one_taken_back():
    """ended_by_itself(), which a worker asks after a hand-back found its claim gone: true after its
    own end committed (the answer may have been lost), a hand-back or the run's end, which deletes
    the item; false while another claim holds the item, and false once the reaper or an operator
    took it (released, or forced the run to fail, which deletes it too), even after another worker
    ended it, or once the run was deleted."""
    durable.start("tests.three_steps", x=1)
    claim = workpool.claim(worker="w1", queues=None, db="default")
    assert not workpool.ended_by_itself(claim)  # still held
    assert workpool.release(claim, run_status="pending")
    assert workpool.ended_by_itself(claim)

    again = workpool.claim(worker="w1", queues=None, db="default")
    WorkItem.objects.filter(id=again.item_id).update(claim_expires_at="2000-01-01T00:00:00Z")
    assert workpool.reap(db="default") == 1  # its lease ran out: taken back
    assert not workpool.ended_by_itself(again)
    other = workpool.claim(worker="w2", queues=None, db="default")
    assert other.item_id == again.item_id and not workpool.ended_by_itself(again)
    assert workpool.release(other, run_status="pending")  # w2 ends what it took from w1
    assert workpool.ended_by_itself(other) and not workpool.ended_by_itself(again)

    third = workpool.claim(worker="w3", queues=None, db="default")
    assert services.release_claim(third.item_id, by="alice")  # an operator takes it back
    assert not workpool.ended_by_itself(third)
    fourth = workpool.claim(worker="w4", queues=None, db="default")
    services.force_fail(fourth.run_id, "stop", by="alice")  # an operator ends it under the worker
    assert not WorkItem.objects.filter(id=fourth.item_id).exists()
    assert not workpool.ended_by_itself(fourth)

    durable.start("tests.three_steps", x=2)
    fifth = workpool.claim(worker="w5", queues=None, db="default")
    assert workpool.finish_run(fifth, status="completed", result="[2, 3, 4]", error=None) == "completed"
    assert not WorkItem.objects.filter(id=fifth.item_id).exists()  # the run's end deleted it
    assert workpool.ended_by_itself(fifth)
    WorkflowRun.objects.filter(pk=fifth.run_id).delete()
    assert not workpool.ended_by_itself(fifth)  # gone with its run: nothing says this worker ended it


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_run_failed_for_good_under_the_reaper_was_not_ended_by_itself(settings):
    """The reaper fails a run out of deliveries (no WORKER_LOST event for that delivery): the item
    keeps its delivery count, so the worker that held it is told its claim was lost."""
    settings.DURABLE_MAX_DELIVERIES = 1
    durable.start("tests.three_steps", x=1)
    claim = workpool.claim(worker="w1", queues=None, db="default")
    WorkItem.objects.filter(id=claim.item_id).update(claim_expires_at="2000-01-01T00:00:00Z")
    assert workpool.reap(db="default") == 1
    assert WorkItem.objects.get(id=claim.item_id).status == WorkItem.Status.FAILED
    assert not workpool.ended_by_itself(claim)
