"""What a `django.tasks` database backend must do, checked against DurableBackend.

The behaviours are those django-tasks-db's own suite asserts of its backend (its tests.py), less
what belongs to that package alone: its model's fields, its query counts, its worker command's
flags, its prune command. Each test here names the behaviour; where DurableBackend does otherwise
by choice, docs/guides/queues-and-tasks.md ("Compared with django-tasks-db") says what and why,
and the test checks what it does instead. test_tasks.py covers the rest of the backend (retries,
timeouts, queues of DURABLE_QUEUES, the admin and the API).

Runs on SQLite and PostgreSQL, on Django 5.2 with the django-tasks backport and on Django 6.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import signal
import uuid

import pytest
from django.db import connections, transaction
from django.test import override_settings
from django.utils import timezone

from django_durable.models import WorkItem
from django_durable.tasks import DurableBackend
from django_durable import testing as durable_testing
from django_durable.testing import drain
from tests.conftest import assert_settled, wait_for
from tests.testapp import ledger
from tests.testapp import tasks as test_tasks

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    TASKS_LOGGER = "django.tasks"
except ImportError:
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started
    TASKS_LOGGER = "django_tasks"

pytestmark = pytest.mark.django_db(transaction=True)

def unfinished(result):
    """The state of a result no worker has touched: what enqueue() returns."""
    return (result.status, result.is_finished, result.started_at, result.last_attempted_at, result.finished_at,
            result.attempts, result.worker_ids, result.errors)


# -- enqueueing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", [test_tasks.noop, test_tasks.noop_async], ids=["sync", "async"])
def test_enqueue_returns_a_ready_result_and_sends_task_enqueued(task):
    received = []
    task_enqueued.connect(receiver := lambda sender, task_result, **kw: received.append((sender, task_result)))
    try:
        result = task.enqueue(1, two=3)
    finally:
        task_enqueued.disconnect(receiver)
    assert uuid.UUID(result.id).version == 7  # django-tasks-db: 4 (a choice, see the docs)
    assert unfinished(result) == (TaskResultStatus.READY, False, None, None, None, 0, [], [])
    assert result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert (result.task, result.args, result.kwargs) == (task, [1], {"two": 3})
    assert received == [(DurableBackend, result)]  # the backend's class, as Django's own backends send it


def test_aenqueue_and_aget_result_give_what_enqueue_and_get_result_give():
    async def both():
        enqueued = await test_tasks.noop.aenqueue()
        return enqueued, await default_task_backend.aget_result(enqueued.id)

    enqueued, read = asyncio.run(both())
    assert unfinished(enqueued) == (TaskResultStatus.READY, False, None, None, None, 0, [], [])
    assert read == enqueued


def test_get_result_is_the_result_enqueue_returned_with_what_using_changed():
    later = timezone.now() + dt.timedelta(hours=3)
    for task in (test_tasks.noop, test_tasks.noop.using(priority=7, queue_name="emails", run_after=later)):
        result = task.enqueue()
        read = default_task_backend.get_result(result.id)
        assert read == result
        assert (read.task.priority, read.task.queue_name, read.task.run_after) == (
            task.priority, task.queue_name, task.run_after)


def test_enqueue_logs_the_enqueued_task_with_its_id(caplog):
    with caplog.at_level(logging.DEBUG, logger=TASKS_LOGGER):
        result = test_tasks.noop.enqueue()
    lines = [record.getMessage() for record in caplog.records if record.name == TASKS_LOGGER]
    assert len(lines) == 1 and "enqueued" in lines[0] and result.id in lines[0]


@pytest.mark.postgres  # row locks and visibility across sessions
def test_enqueue_inside_a_transaction_is_seen_by_others_only_after_it_commits():
    """The backend does not wait for the commit to store the task: inside the transaction the
    task is there; another connection sees it once the transaction commits."""
    other = connections.create_connection("default")

    def seen_elsewhere():
        with other.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM durable_workflow_run")
            return cursor.fetchone()[0]

    try:
        with transaction.atomic():
            result = test_tasks.noop.enqueue()
            assert result.enqueued_at is not None
            assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY
            assert seen_elsewhere() == 0
        assert seen_elsewhere() == 1
    finally:
        other.close()


def test_a_task_is_validated_when_it_is_enqueued():
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        test_tasks.noop.using(queue_name="unknown_queue").enqueue()
    with pytest.raises(InvalidTask, match="priority"):
        test_tasks.noop.using(priority=101).enqueue()
    naive = dt.datetime(2030, 1, 1)
    with pytest.raises(InvalidTask, match="aware"):
        test_tasks.noop.using(run_after=naive).enqueue()
    assert not WorkItem.objects.exists()


# -- results ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("result_id", [str(uuid.uuid4()), "123"], ids=["unknown", "not a uuid"])
def test_a_result_that_does_not_exist_raises_sync_and_async(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(default_task_backend.aget_result(result_id))


def test_a_result_is_refreshed_in_place_once_its_task_ran():
    result = test_tasks.meaning_of_life.enqueue()
    drain(worker="w-1")
    assert result.status == TaskResultStatus.READY  # the object is not changed behind its back
    result.refresh()
    assert (result.status, result.is_finished, result.return_value, result.attempts, result.worker_ids) == (
        TaskResultStatus.SUCCESSFUL, True, 42, 1, ["w-1"])
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at is not None
    asynchronous = test_tasks.meaning_of_life.enqueue()
    drain()
    asyncio.run(asynchronous.arefresh())
    assert (asynchronous.status, asynchronous.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


# -- the backend's checks --------------------------------------------------------------------------


def test_the_backend_checks_clean_when_configured_as_documented():
    assert list(default_task_backend.check()) == []


def test_the_backend_check_says_when_django_durable_is_not_installed():
    from django.conf import settings

    with override_settings(INSTALLED_APPS=[app for app in settings.INSTALLED_APPS if app != "django_durable"]):
        errors = list(task_backends["default"].check())
    assert [error.id for error in errors] == ["django_durable.E013"]
    assert "django_durable" in errors[0].hint


def test_the_backend_check_refuses_options_it_does_not_know():
    backend = DurableBackend("custom", {"OPTIONS": {"id_function": "uuid.uuid1", "queue_nme": "x"}})
    errors = list(backend.check())
    assert [error.id for error in errors] == ["django_durable.E014"]
    assert "'id_function', 'queue_nme'" in errors[0].msg


# -- a worker runs them ----------------------------------------------------------------------------


def test_a_worker_runs_every_ready_task_and_records_each_ending():
    successes = [test_tasks.noop.enqueue() for _ in range(3)]
    failure = test_tasks.fails.enqueue()
    assert drain() == 4
    assert [default_task_backend.get_result(r.id).status for r in successes] == [TaskResultStatus.SUCCESSFUL] * 3
    failure.refresh()
    assert failure.status == TaskResultStatus.FAILED and failure.errors[0].exception_class is ValueError
    assert failure.enqueued_at <= failure.started_at <= failure.finished_at
    assert failure.errors[0].traceback.endswith("ValueError: This task failed due to ValueError\n")
    with pytest.raises(ValueError, match="Task failed"):
        failure.return_value  # noqa: B018
    assert_settled()


def test_a_worker_serves_only_its_queues():
    result = test_tasks.noop.using(queue_name="emails").enqueue()
    assert drain(queues=["default"]) == 0
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY
    assert drain(queues=["emails"]) == 1
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    other = test_tasks.noop.using(queue_name="slow").enqueue()
    assert drain() == 1  # a worker of every queue (the default)
    assert default_task_backend.get_result(other.id).status == TaskResultStatus.SUCCESSFUL


def test_a_return_value_that_is_not_json_fails_the_task_with_a_type_error():
    result = test_tasks.complex_return_value.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result._return_value is None
    assert result.errors[0].exception_class is TypeError
    assert "is not JSON serializable" in result.errors[0].traceback
    assert result.enqueued_at <= result.started_at <= result.finished_at


@pytest.mark.parametrize("task, exception", [
    (test_tasks.exits, SystemExit), (test_tasks.calls_exit, SystemExit), (test_tasks.interrupts, KeyboardInterrupt),
], ids=["raise SystemExit", "exit(1)", "raise KeyboardInterrupt"])
def test_a_task_that_exits_or_raises_keyboard_interrupt_fails_and_the_worker_goes_on(task, exception):
    stopped = task.enqueue()
    after = test_tasks.meaning_of_life.enqueue()
    assert drain() == 2  # the exception did not leave the worker
    stopped.refresh()
    assert stopped.status == TaskResultStatus.FAILED and stopped.errors[0].exception_class is exception
    assert default_task_backend.get_result(after.id).return_value == 42


def test_run_after_holds_a_task_until_its_time_and_then_it_runs():
    with durable_testing.clock() as test_clock:
        result = test_tasks.noop.using(run_after=test_clock.now + dt.timedelta(hours=10)).enqueue()
        assert drain() == 0
        assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY
        test_clock.advance(hours=11)
        assert drain() == 1
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("passed", ["at enqueue", "later"])
def test_tasks_run_by_priority_then_by_when_they_became_ready(passed):
    """A task whose run_after has passed takes its place by priority, and within one priority by
    its run_after (the older first), not by when it was enqueued or a worker noticed it."""
    with durable_testing.clock() as test_clock:
        now = test_clock.now + dt.timedelta(hours=20)
        if passed == "at enqueue":
            test_clock.set(now)
        tasks = {
            "old": test_tasks.record.using(priority=20, run_after=now - dt.timedelta(hours=2)),
            "very-old": test_tasks.record.using(priority=20, run_after=now - dt.timedelta(hours=10)),
            "far-future": test_tasks.record.using(run_after=now + dt.timedelta(hours=10)),
            "high-priority-far-future": test_tasks.record.using(priority=10, run_after=now + dt.timedelta(hours=10)),
            "future": test_tasks.record.using(run_after=now + dt.timedelta(hours=2)),
            "high-priority": test_tasks.record.using(priority=10),
            "low-priority": test_tasks.record.using(priority=2),
            "lower-priority": test_tasks.record.using(priority=-2),
        }
        keys = {f"{name}-{uuid.uuid4()}": name for name in tasks}
        for key, name in keys.items():
            tasks[name].enqueue(key)
        test_clock.set(now)
        assert drain(worker="only") == 5
    ran = [keys[key] for key, step, _ in ledger.entries() if key in keys and step == "ran"]
    assert ran == ["very-old", "old", "high-priority", "low-priority", "lower-priority"]


@pytest.mark.postgres  # row locks and visibility across sessions
def test_a_worker_skips_a_task_another_session_holds_locked_and_runs_the_next():
    first = test_tasks.noop.enqueue()
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute("SELECT id FROM durable_work_item FOR UPDATE")
            assert len(cursor.fetchall()) == 1
        second = test_tasks.noop.enqueue()
        assert drain() == 1
    finally:
        other.close()
    assert default_task_backend.get_result(first.id).status == TaskResultStatus.READY
    assert default_task_backend.get_result(second.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_that_takes_its_context_sees_its_result_and_attempt():
    result = test_tasks.my_id.enqueue()
    checked = test_tasks.checks_context.enqueue(1)
    drain()
    assert default_task_backend.get_result(result.id).return_value == {"id": result.id, "attempt": 1}
    assert default_task_backend.get_result(checked.id).status == TaskResultStatus.SUCCESSFUL


def test_started_and_finished_are_sent_around_each_attempt_with_the_backend_class():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id, task_result.status, list(task_result.worker_ids)))

    task_started.connect(receiver)
    task_finished.connect(receiver)
    try:
        result = test_tasks.meaning_of_life.enqueue()
        drain(worker="w-1")
    finally:
        task_started.disconnect(receiver)
        task_finished.disconnect(receiver)
    assert seen == [(DurableBackend, result.id, TaskResultStatus.RUNNING, ["w-1"]),
                    (DurableBackend, result.id, TaskResultStatus.SUCCESSFUL, ["w-1"])]


# -- worker processes ------------------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signalled_worker_finishes_the_running_task_and_exits_cleanly(start_worker, signum):
    key = str(uuid.uuid4())
    result = test_tasks.sleeps_then_records.enqueue(2, key)
    worker = start_worker(burst=False)
    wait_for(lambda: ledger.count(key, "started") == 1, timeout=60, message="the task to start")
    running = default_task_backend.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING and running.worker_ids != []
    worker.signal(signum)
    assert worker.wait(60) == 0, worker.log()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and ledger.count(key, "finished") == 1


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_task_whose_worker_was_killed_runs_again_and_counts_both_attempts(start_worker):
    """django-tasks-db leaves such a task RUNNING for ever (its issue 46); here its lease runs
    out, another worker runs it, and the killed attempt counts in attempts and worker_ids."""
    key = str(uuid.uuid4())
    result = test_tasks.sleeps_then_records.enqueue(30, key)
    lease = {"DURABLE_LEASE_SECONDS": "2"}
    first = start_worker(burst=False, env=lease)
    wait_for(lambda: ledger.count(key, "started") == 1, timeout=60, message="the task to start")
    killed_name = default_task_backend.get_result(result.id).worker_ids[0]
    first.kill()
    assert first.wait(30) == -signal.SIGKILL
    test_tasks.sleeps_then_records.enqueue(0, key + "-other")  # the next worker has other work too
    from django_durable.models import WorkflowRun

    WorkflowRun.objects.filter(pk=result.id).update(input=WorkflowRun.objects.get(pk=result.id).input.replace(
        "30", "0", 1))  # the second attempt need not sleep as long
    second = start_worker(env=lease)
    assert second.wait(90) == 0, second.log()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 2, result.worker_ids
    assert result.worker_ids[0] == killed_name and result.worker_ids[1] != killed_name
    assert ledger.count(key, "started") == 2  # at least once: the killed attempt started, and the retry


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_several_workers_run_each_task_once(start_worker):
    keys = [str(uuid.uuid4()) for _ in range(10)]
    results = [test_tasks.sleeps_then_records.enqueue(0.1, key) for key in keys]
    workers = [start_worker() for _ in range(3)]
    for worker in workers:
        assert worker.wait(90) == 0, worker.log()
    assert all(default_task_backend.get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in results)
    assert all(ledger.count(key, "started") == 1 for key in keys)
    assert_settled()


# -- what django-ox documents beyond: a reply lost after COMMIT, a dead connection ----------------


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_reply_lost_after_the_end_committed_leaves_the_task_successful_and_run_once(start_worker, tmp_path):
    """The statement that ends the task commits, then the worker sees an error instead of its reply
    (fault after_terminal_commit): it does not run the task again, does not report its claim lost
    (no other worker took it), and goes on with the next."""
    key, after = str(uuid.uuid4()), str(uuid.uuid4())
    result = test_tasks.record.enqueue(key)
    worker = start_worker(faults=f"after_terminal_commit=once:{tmp_path / 'lost'}+raise")
    test_tasks.record.enqueue(after)
    assert worker.wait(60) == 0, worker.log()
    assert (tmp_path / "lost").exists()  # the fault fired
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert ledger.count(key, "ran") == 1 and ledger.count(after, "ran") == 1
    # Its end committed: no claim was lost, whatever the error said.
    assert "lost its claim" not in worker.log() and "already ended" in worker.log(), worker.log()
    assert_settled()


@pytest.mark.postgres
@pytest.mark.processes
@pytest.mark.timeout(120)
def test_a_worker_whose_connection_dies_reconnects_and_the_task_ends_successful(start_worker, tmp_path):
    """The worker's connection is terminated by the server just after its claim committed: the
    worker reconnects, the task ends SUCCESSFUL (run again if its end was lost: at least once),
    and the worker was neither replaced nor counted as lost."""
    key = str(uuid.uuid4())
    result = test_tasks.record.enqueue(key)
    worker = start_worker(faults=f"after_claim_commit=once:{tmp_path / 'cut'}+terminate")
    assert worker.wait(90) == 0, worker.log()
    assert (tmp_path / "cut").exists()
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.SUCCESSFUL
    assert 1 <= ledger.count(key, "ran") <= 2
    assert "was lost" not in worker.log() and worker.log().count("started (queues") == 1
    assert_settled()
