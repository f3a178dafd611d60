"""What surrounds the steps of a run: start() in one statement, start_many(), and a wait() that
is told of the run's end instead of polling for it (PostgreSQL)."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable.models import WorkflowRun, WorkItem
from django_durable.services import runs as run_services
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def test_start_many_starts_a_run_for_each_call_in_order():
    ids = durable.start_many("tests.three_steps", [{"x": 1}, (5,), {"x": 10}])
    assert len(ids) == 3 and len(set(ids)) == 3
    assert WorkItem.objects.filter(run_id__in=ids, kind="advance", status="pending").count() == 3
    assert drain() == 3
    assert [durable.wait(run_id, timeout=1) for run_id in ids] == [[1, 2, 3], [5, 6, 7], [10, 11, 12]]
    assert durable.start_many("tests.three_steps", []) == []


def test_start_many_stores_nothing_when_one_call_is_refused():
    with pytest.raises(durable.InvalidArguments, match=r"start_many\(\) calls\[1\]: .*'y'"):
        durable.start_many("tests.three_steps", [{"x": 1}, {"y": 2}])
    with pytest.raises(TypeError, match=r"calls\[1\] is a str"):
        durable.start_many("tests.three_steps", [{"x": 1}, "x=2"])
    with pytest.raises(durable.WorkflowNotFound):
        durable.start_many("tests.no_such_workflow", [{}])
    assert not WorkflowRun.objects.exists() and not WorkItem.objects.exists()


def test_start_many_commits_with_the_callers_transaction():
    with pytest.raises(RuntimeError), transaction.atomic():
        durable.start_many("tests.three_steps", [{"x": 1}] * 3)
        raise RuntimeError("the caller's transaction rolls back")
    assert not WorkflowRun.objects.exists()
    with transaction.atomic():
        ids = durable.start_many("tests.three_steps", [{"x": 1}] * 3, queue="bulk", priority=5)
    assert set(WorkItem.objects.filter(run_id__in=ids).values_list("queue", "priority")) == {("bulk", 5)}


@pytest.mark.postgres
def test_start_is_one_statement_on_postgresql():
    with CaptureQueriesContext(connection) as queries:
        run = durable.start("tests.three_steps", x=2)
    assert len(queries) == 1, [q["sql"] for q in queries]
    assert run.created_at is not None and not run._state.adding
    assert WorkItem.objects.get(run=run).status == "pending"
    drain()
    assert durable.wait(run.pk, timeout=1) == [2, 3, 4]


@pytest.mark.postgres
def test_only_a_run_someone_waits_for_announces_its_end():
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN durable_done")
        unwatched = durable.start("tests.three_steps")
        drain()
        assert [n.payload for n in listener.notifies(timeout=0.3)] == []
        watched = durable.start("tests.three_steps")
        with pytest.raises(durable.WaitTimeout):
            durable.wait(watched.pk, timeout=0.01)  # marks it waited for
        drain()
        assert [n.payload for n in listener.notifies(timeout=2, stop_after=1)] == [str(watched.pk)]
    assert WorkflowRun.objects.get(pk=watched.pk).awaited
    assert not WorkflowRun.objects.get(pk=unwatched.pk).awaited


@pytest.mark.postgres
def test_wait_is_woken_by_the_runs_end_not_by_polling(start_worker, monkeypatch, tmp_path):
    """With the pauses between looks set to a minute, the first pause lasts the whole timeout
    (40 s) unless the notification ends it: the run takes half a second."""
    monkeypatch.setattr(run_services, "LISTENING_FIRST_PAUSE", 60.0)
    monkeypatch.setattr(run_services, "LONGEST_PAUSE", 60.0)
    worker = start_worker(burst=False)
    run = durable.start("tests.sleep_in_b", 0.5, str(tmp_path / "reached"))
    started = time.monotonic()
    assert durable.wait(run.pk, timeout=40) == "done"
    assert time.monotonic() - started < 30, "the wait was not woken by the run's end"
    assert worker.running()


@pytest.mark.postgres
def test_a_cancel_from_outside_wakes_a_wait_at_once(monkeypatch):
    """A run no worker holds, cancelled by an operator: its end is announced too."""
    import threading

    from django.db import connections

    monkeypatch.setattr(run_services, "LISTENING_FIRST_PAUSE", 60.0)
    monkeypatch.setattr(run_services, "LONGEST_PAUSE", 60.0)
    run = durable.start("tests.three_steps")
    outcome = {}

    def waiter():
        started = time.monotonic()
        try:
            durable.wait(run.pk, timeout=40)
        except durable.WorkflowFailed as exc:
            outcome["status"] = exc.status
        finally:
            outcome["seconds"] = time.monotonic() - started
            connections.close_all()

    thread = threading.Thread(target=waiter)
    thread.start()
    deadline = time.monotonic() + 20
    while not WorkflowRun.objects.get(pk=run.pk).awaited and time.monotonic() < deadline:
        time.sleep(0.02)
    durable.cancel(run.pk)
    thread.join(45)
    assert outcome.get("status") == "cancelled", outcome
    assert outcome["seconds"] < 30, "the wait was not woken by the cancel"
