"""Many producers (RELIABILITY T45): a start wakes idle workers only when its queue has no ready
item waiting, so producers do not queue behind each other's NOTIFY at commit (bench/producers.py
measures it; a worker that runs out of work looks once more 50 ms later, for a start that saw the
item it was taking)."""

from __future__ import annotations

import pytest
from django.db import connection

import django_durable as durable
from django_durable.workpool import NOTIFY_CHANNEL

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _listener():
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
    return listener


def _heard(listener) -> int:
    return sum(1 for _ in listener.notifies(timeout=0.3))


def test_a_start_notifies_only_when_its_queue_has_no_ready_item_waiting():
    listener = _listener()
    try:
        durable.start("tests.three_steps", x=1)  # nothing waiting: an idle worker is told
        assert _heard(listener) == 1
        durable.start("tests.three_steps", x=2)  # the first still waits: the workers are busy
        durable.start("tests.three_steps", x=3)
        assert _heard(listener) == 0
        durable.start("tests.three_steps", x=4, queue="emails")  # another queue, nothing waiting there
        assert _heard(listener) == 1
    finally:
        listener.close()



def _looked(capture) -> list[bool]:
    """For each start captured: whether its statement looked for a ready item (and could NOTIFY)."""
    return ["pg_notify" in query["sql"] for query in capture.captured_queries if "durable_workflow_run" in query["sql"]]


def test_a_start_just_after_one_that_saw_a_ready_item_neither_looks_nor_notifies(monkeypatch):
    """Its own transaction, within runs.READY_SEEN_SECONDS of a start in this process that saw a
    ready item waiting in its queue. One inside a transaction looks (what it sees may be its own
    transaction's items), and so does one after the window or in another queue."""
    from django.db import transaction
    from django.test.utils import CaptureQueriesContext

    from django_durable.workpool import runs

    monkeypatch.setattr(runs, "READY_SEEN_SECONDS", 3600)
    monkeypatch.setattr(runs, "_ready_seen", {})
    listener = _listener()
    try:
        with CaptureQueriesContext(connection) as capture:
            durable.start("tests.three_steps", x=1)  # nothing waiting: it looks and tells
            durable.start("tests.three_steps", x=2)  # it looks, sees the first waiting
            durable.start("tests.three_steps", x=3)  # within the window: no look
            durable.start("tests.three_steps", x=4, queue="emails")  # another queue: it looks
            with transaction.atomic():
                durable.start("tests.three_steps", x=5)  # inside a transaction: it looks
        assert _looked(capture) == [True, True, False, True, True]
        assert _heard(listener) == 2  # the first start's and the other queue's
        monkeypatch.setattr(runs, "READY_SEEN_SECONDS", 0)
        with CaptureQueriesContext(connection) as capture:
            durable.start("tests.three_steps", x=6)  # the window over: it looks again
        assert _looked(capture) == [True]
        assert _heard(listener) == 0
    finally:
        listener.close()


def test_a_start_that_skipped_its_look_is_taken_by_a_worker_that_just_went_idle(start_worker):
    """Two starts, the second seeing the first waiting; 10 ms later a third, within the window,
    neither looks nor NOTIFIES, while the worker (quicker than these starts) has taken both and
    gone idle. It polls only once an hour: it takes the third because it looks once more 50 ms
    after its last claim, even when a NOTIFY that arrived late woke it sooner. A run left for the
    poll would fail its wait."""
    import random
    import time

    from django.test.utils import CaptureQueriesContext

    from tests.conftest import wait_for

    worker = start_worker(burst=False, env={"DURABLE_POLL_INTERVAL": "3600"})
    wait_for(lambda: "started (queues" in worker.log(), message="the worker to start")
    skipped = 0
    pace = random.Random(41)
    for n in range(60):
        # The first start lands at any moment of the worker's last look (50 ms after its work), so
        # that it sometimes takes that run before its NOTIFY arrives, and wakes early for it.
        time.sleep(pace.uniform(0, 0.06))
        durable.start("tests.echo", n)
        durable.start("tests.echo", n)
        time.sleep(0.01)  # a producer's pace: the worker catches up meanwhile
        with CaptureQueriesContext(connection) as capture:
            last = durable.start("tests.echo", n)
        skipped += _looked(capture).count(False)
        assert durable.wait(last.pk, timeout=30) == {"args": [n], "kwargs": {}}, n
    assert skipped > 0  # (some of the third starts did skip their look)
