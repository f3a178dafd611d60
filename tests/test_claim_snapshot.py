"""A claim reads the run's messages, journal and children as of its statement's start, and locks
the item later. A wakeup that commits in between (a signal, a child's end, a branch's end) found
the item pending and left no flag; the claim then took it without seeing what woke it, and the run
went back to waiting with the signal stored and unread, for ever (RELIABILITY: a signal is never
lost). The claim now notices that its item changed after its statement began and flags it to go
again when it ends."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections

import django_durable as durable
from django_durable import workpool
from django_durable.engine.replay import advance
from django_durable.models import WorkflowRun, WorkItem
from django_durable.workpool import postgres, statements

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, pytest.mark.timeout(120)]


def slowed(sql: str) -> str:
    """`sql` sleeping 0.8 s after its statement began, before its first WHERE reads the ready items."""
    return sql.replace(" WHERE ", " WHERE (SELECT pg_sleep(0.8) IS NOT NULL) AND ", 1)


@pytest.fixture
def slow_claims(monkeypatch):
    """Every claim of one item is slowed (slowed())."""
    real = postgres._pick

    def pick(*args, **kwargs):
        sql, params = real(*args, **kwargs)
        return slowed(sql), params

    monkeypatch.setattr(postgres, "_pick", pick)
    postgres._claim_sql_cache.clear()
    yield
    postgres._claim_sql_cache.clear()


def signal_during(run_id, delay: float) -> threading.Thread:
    def send():
        try:
            time.sleep(delay)
            durable.signal(run_id, "go", 1)
        finally:
            connections.close_all()

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_a_signal_that_commits_while_a_claim_is_under_way_is_not_lost(slow_claims):
    run = durable.start("tests.two_signals")
    claim = workpool.claim(worker="w", queues=None, db="default")
    advance(claim)  # waits for "go"
    assert WorkflowRun.objects.get(pk=run.pk).waiting_on == "signal 'go'"
    # The run is woken by a first signal and waits for its claim; a second signal commits while
    # the claim's statement is under way (after its start, before it reaches the item).
    durable.signal(run.pk, "go", 0)
    sender = signal_during(run.pk, 0.3)
    claim = workpool.claim(worker="w", queues=None, db="default")
    sender.join(timeout=30)
    assert claim is not None and claim.run_id == run.pk
    advance(claim)
    item = WorkItem.objects.get(run_id=run.pk)
    # The claim saw only the first signal; the run took it and waits for the second, but its item
    # goes again (wake), and the next claim sees the second.
    assert item.status == "pending", "the second signal was stored but nothing will read it"
    claim = workpool.claim(worker="w", queues=None, db="default")
    advance(claim)
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    assert durable.wait(run.pk, timeout=1) == [0, 1]


def test_a_batch_claim_notices_it_too(monkeypatch):
    real = statements.in_transaction

    def slow(db, prelude, sql, params, **kwargs):  # the batch's claim sleeps before it reads the ready items
        return real(db, prelude, slowed(sql), params, **kwargs)

    run = durable.start("tests.two_signals")
    advance(workpool.claim(worker="w", queues=None, db="default"))  # waits for "go"
    durable.signal(run.pk, "go", 0)
    monkeypatch.setattr(statements, "in_transaction", slow)
    sender = signal_during(run.pk, 0.3)
    claims = workpool.claim_many(worker="w", queues=None, db="default", k=4)
    sender.join(timeout=30)
    monkeypatch.setattr(statements, "in_transaction", real)
    assert [c.run_id for c in claims] == [run.pk]
    advance(claims[0])
    assert WorkItem.objects.get(run_id=run.pk).status == "pending"
    advance(workpool.claim(worker="w", queues=None, db="default"))
    assert durable.wait(run.pk, timeout=1) == [0, 1]
