"""When a worker that ran out of work looks once more (worker.process.Settle): a start may skip its
NOTIFY when it, or another start in its process a moment before, saw a ready item waiting, and
that item may be the last one the worker took (test_producers.py runs it with a real worker)."""

import pytest

from django_durable.worker.process import SETTLE_SECONDS, Settle


def test_a_worker_looks_once_more_a_settle_after_its_last_work_whatever_wakes_it_sooner():
    settle = Settle()
    assert settle.wait(30.0, began=0.0, now=0.0) == 30.0  # no work yet: the poll interval
    settle.worked(10.0)
    # Ran out of work: it waits for the settle.
    assert settle.wait(30.0, began=10.001, now=10.002) == pytest.approx(SETTLE_SECONDS - 0.002)
    # A notification sent while it was busy (for a run it has taken since) wakes it at once; that
    # look found nothing, and it waits on for the settle, not for the poll interval.
    assert settle.wait(30.0, began=10.003, now=10.004) == pytest.approx(SETTLE_SECONDS - 0.004)
    # The look that began at the settle found nothing: the poll interval, until it works again.
    assert settle.wait(30.0, began=10.0 + SETTLE_SECONDS, now=10.06) == 30.0
    assert settle.wait(30.0, began=40.0, now=40.0) == 30.0
    settle.worked(50.0)
    assert settle.wait(0.01, began=50.001, now=50.001) == 0.01  # a shorter wait (a queue's limits) wins
    assert settle.wait(30.0, began=50.2, now=50.2) == 30.0  # past the settle already
