"""The django.tasks backend (django_durable.tasks.DurableBackend): a conformance suite.

The behaviours are those django-tasks checks its own backends for (enqueue, results, errors,
context, signals, priorities, run_after, validation), here against durable workers: in this
process with drain(), and in real worker processes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import uuid

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable.models import Step, WorkflowRun
from django_durable.tasks import DurableBackend
from django_durable.testing import drain
from tests.conftest import assert_settled
from tests.testapp import ledger
from tests.testapp import tasks as test_tasks

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_backend_is_the_durable_one():
    assert isinstance(task_backends["default"], DurableBackend) and default_task_backend.alias == "default"
    features = (default_task_backend.supports_defer, default_task_backend.supports_async_task,
                default_task_backend.supports_get_result, default_task_backend.supports_priority)
    assert features == (True, True, True, True)


# -- enqueue and results --------------------------------------------------------------------------


def test_enqueue_returns_a_ready_result_that_a_worker_completes():
    result = test_tasks.echo.enqueue(1, two=3)
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert (result.args, result.kwargs, result.task, result.backend) == ([1], {"two": 3}, test_tasks.echo, "default")
    assert result.enqueued_at is not None and result.started_at is None and result.worker_ids == []
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value  # noqa: B018
    assert drain(worker="w-1") == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    assert result.return_value == {"args": [1], "kwargs": {"two": 3}}
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at is not None
    assert (result.attempts, result.worker_ids, result.errors) == (1, ["w-1"], [])
    again = default_task_backend.get_result(result.id)
    assert again.return_value == result.return_value and again.id == result.id
    assert test_tasks.echo.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_task_writes_no_journal_and_one_statement_ends_it_and_claims_the_next():
    first, second = test_tasks.noop.enqueue(), test_tasks.noop.enqueue()
    with CaptureQueriesContext(connection) as queries:
        assert drain() == 2
    assert not Step.objects.exists()  # a task needs no journal
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT", "WITH"))]
    assert not any(re.search(r'(INTO|UPDATE)\s+"?durable_step\b', write) for write in writes), writes
    if connection.vendor == "postgresql":
        # One statement ends each task (and claims the next); the first claim, and the last one
        # that finds nothing left, are the other two.
        assert [write.lstrip().startswith("WITH fence") for write in writes] == [False, True, True, False], writes
    assert {default_task_backend.get_result(r.id).status for r in (first, second)} == {TaskResultStatus.SUCCESSFUL}


def test_an_async_task_runs():
    result = test_tasks.add_async.enqueue(2, 3)
    drain()
    assert default_task_backend.get_result(result.id).return_value == 5


def test_aenqueue_and_aget_result():
    from asgiref.sync import sync_to_async
    from django.db import connections

    result = asyncio.run(_aenqueue())
    drain()
    fetched = asyncio.run(default_task_backend.aget_result(result.id))
    # Both ran in asgiref's one thread for sync code: its connection would stay open after the
    # test (and keep PostgreSQL's test database from being dropped at the end of the run).
    asyncio.run(sync_to_async(connections.close_all)())
    assert fetched.return_value == 42


async def _aenqueue():
    return await test_tasks.meaning_of_life.aenqueue()


@pytest.mark.parametrize("task, exception, message", [
    (test_tasks.fails, ValueError, "This task failed due to ValueError"),
    (test_tasks.exits, SystemExit, "This task failed due to SystemExit"),
    (test_tasks.interrupts, KeyboardInterrupt, "This task failed due to KeyboardInterrupt"),
])
def test_a_failing_task_records_its_error_and_traceback(task, exception, message):
    result = task.enqueue()
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert len(result.errors) == 1
    assert result.errors[0].exception_class is exception
    assert result.errors[0].traceback.endswith(f"{exception.__name__}: {message}\n"), result.errors[0].traceback
    assert result.finished_at >= result.started_at


def test_a_complex_exception_and_a_return_value_that_cannot_be_stored():
    raised, returned = test_tasks.complex_exception.enqueue(), test_tasks.complex_return_value.enqueue()
    drain()
    raised, returned = (default_task_backend.get_result(r.id) for r in (raised, returned))
    assert raised.status == TaskResultStatus.FAILED and raised.errors[0].exception_class is ValueError
    assert "This task failed" in raised.errors[0].traceback
    assert returned.status == TaskResultStatus.FAILED
    assert returned.errors[0].exception_class is TypeError  # as django.tasks says; the value's type named
    assert "is not JSON serializable" in returned.errors[0].traceback and "function" in returned.errors[0].traceback


@pytest.mark.parametrize("result_id", [str(uuid.uuid4()), "not-a-uuid", ""])
def test_an_unknown_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(result_id)


def test_a_workflow_run_is_not_a_task_result_and_a_task_checks_its_own():
    run = durable.start("tests.echo", 1)
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(run.pk))
    result = test_tasks.noop.enqueue()
    with pytest.raises(TaskResultMismatch):
        test_tasks.meaning_of_life.get_result(result.id)


# -- context, retries, timeouts -------------------------------------------------------------------


def test_a_task_that_takes_its_context_sees_its_id_and_attempt():
    result = test_tasks.my_id.enqueue()
    drain()
    assert default_task_backend.get_result(result.id).return_value == {"id": result.id, "attempt": 1}


def test_a_failed_attempt_is_retried_after_its_back_off_and_counted():
    key = str(uuid.uuid4())
    result = test_tasks.fails_once.enqueue(key)
    drain(worker="w-1")
    result.refresh()
    assert result.status == TaskResultStatus.READY  # waiting for its back-off
    assert (result.worker_ids, [e.exception_class for e in result.errors]) == (["w-1"], [ConnectionError])
    assert durable.wake(result.id) == 1  # the back-off's timer, fired now
    drain(worker="w-2")
    result.refresh()
    assert (result.status, result.return_value, result.attempts) == (TaskResultStatus.SUCCESSFUL, 2, 2)
    assert result.worker_ids == ["w-1", "w-2"] and len(result.errors) == 1
    assert ledger.count(key, "attempt") == 2


def test_an_exception_the_policy_names_is_not_retried():
    key = str(uuid.uuid4())
    result = test_tasks.never_retried.enqueue(key)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and ledger.count(key, "attempt") == 1


def test_an_attempt_past_its_timeout_is_stopped_and_fails():
    result = test_tasks.sleeps.enqueue(5)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is durable.StepTimeout
    assert (result.finished_at - result.started_at).total_seconds() < 3


# -- options: priority, queues, run_after, validation ---------------------------------------------


def test_higher_priority_runs_first():
    low = test_tasks.record.using(priority=-10).enqueue("low")
    high = test_tasks.record.using(priority=50).enqueue("high")
    drain(max_items=1)
    assert default_task_backend.get_result(high.id).status == TaskResultStatus.SUCCESSFUL
    assert default_task_backend.get_result(low.id).status == TaskResultStatus.READY


def test_a_task_goes_to_its_queue_and_only_named_queues_are_accepted():
    result = test_tasks.send_email.enqueue("a@example.com")
    run = WorkflowRun.objects.get(pk=result.id)
    assert (run.queue, run.priority) == ("emails", 5)
    assert drain(queues=["default"]) == 0 and drain(queues=["emails"]) == 1
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid for backend"):
        test_tasks.noop.using(queue_name="nowhere")


@override_settings(DURABLE_QUEUES={"reports": {"concurrency": 2}})
def test_without_queues_in_tasks_the_queues_of_durable_queues_are_accepted():
    with override_settings(TASKS={"default": {"BACKEND": "django_durable.tasks.DurableBackend"}}):
        backend = task_backends["default"]
        assert backend.queues == {"default", "reports"}


def test_run_after_holds_the_task_until_then():
    later = test_tasks.record.using(run_after=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).enqueue("later")
    assert drain() == 0
    assert default_task_backend.get_result(later.id).status == TaskResultStatus.READY
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        test_tasks.record.using(run_after=dt.datetime(2030, 1, 1))


def test_bad_options_and_arguments_are_refused_before_anything_is_stored():
    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        test_tasks.noop.using(priority=101)
    with pytest.raises(InvalidTask, match="retry must be a durable.RetryPolicy"):
        test_tasks.noop.get_backend().task_class(func=test_tasks.noop.func, retry=0)
    with pytest.raises(durable.InvalidArguments, match="cannot be enqueued with these arguments"):
        test_tasks.meaning_of_life.enqueue(1)
    with pytest.raises(durable.NotSerializable):
        test_tasks.echo.enqueue(object())
    assert not WorkflowRun.objects.exists()


# -- transactions, signals, cancel ----------------------------------------------------------------


def test_a_task_enqueued_in_a_transaction_commits_or_rolls_back_with_it():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            test_tasks.noop.enqueue()
            raise RuntimeError("roll back")
    assert not WorkflowRun.objects.exists()
    with transaction.atomic():
        kept = test_tasks.noop.enqueue()
    assert WorkflowRun.objects.filter(pk=kept.id).exists()


def test_the_signals_are_sent_with_the_result():
    seen = []

    def receiver(signal_name):
        return lambda sender, task_result, **kwargs: seen.append((signal_name, sender, task_result.status))

    receivers = {name: receiver(name) for name in ("enqueued", "started", "finished")}
    task_enqueued.connect(receivers["enqueued"])
    task_started.connect(receivers["started"])
    task_finished.connect(receivers["finished"])
    try:
        test_tasks.meaning_of_life.enqueue()
        test_tasks.fails.enqueue()
        drain()
    finally:
        task_enqueued.disconnect(receivers["enqueued"])
        task_started.disconnect(receivers["started"])
        task_finished.disconnect(receivers["finished"])
    statuses = [(name, status) for name, _, status in seen]
    assert statuses == [("enqueued", "READY"), ("enqueued", "READY"), ("started", "RUNNING"),
                        ("finished", "SUCCESSFUL"), ("started", "RUNNING"), ("finished", "FAILED")]
    assert {sender for _, sender, _ in seen} == {DurableBackend}


@pytest.fixture
def built(monkeypatch):
    """The statuses of the TaskResults the backend builds, in order."""
    from django_durable import tasks as backend

    statuses = []
    original = backend.TaskResult

    def counted(*args, **kwargs):
        statuses.append(kwargs["status"])
        return original(*args, **kwargs)

    monkeypatch.setattr(backend, "TaskResult", counted)
    return statuses


def test_a_worker_builds_task_results_only_for_someone_who_listens(built, caplog):
    import logging

    from django_durable import tasks as backend

    tasks_logger = backend._tasks_logger
    level = tasks_logger.level
    try:
        tasks_logger.setLevel(logging.WARNING)  # django.tasks' own receivers would log nothing
        test_tasks.meaning_of_life.enqueue()  # (the result enqueue() returns is built, of course)
        built.clear()
        drain()
        assert built == []
        result = test_tasks.fails.enqueue()
        drain()  # a failure is logged at ERROR: its result is read and sent
        assert WorkflowRun.objects.get(pk=result.id).status == "failed"

        built.clear()
        tasks_logger.setLevel(logging.INFO)  # now Django's log lines need the results
        with caplog.at_level(logging.INFO, logger=tasks_logger.name):
            done = test_tasks.meaning_of_life.enqueue()
            built.clear()
            drain()
        assert built == [TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL]
        assert f"Task id={done.id} " in caplog.text and "state=SUCCESSFUL" in caplog.text

        built.clear()
        tasks_logger.setLevel(logging.WARNING)
        seen = []

        def receiver(sender, task_result, **kwargs):
            seen.append(task_result.status)

        task_finished.connect(receiver)
        try:
            test_tasks.meaning_of_life.enqueue()
            built.clear()
            drain()
        finally:
            task_finished.disconnect(receiver)
        assert seen == [TaskResultStatus.SUCCESSFUL] and built == [TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL]
    finally:
        tasks_logger.setLevel(level)


def test_django_default_logging_without_debug_hears_only_failures(built, settings):
    """Django's default LOGGING enables django.tasks' logger at INFO, but without DEBUG its console
    handler drops every line and the admins' mail takes only errors: a worker builds no TaskResult
    for a success, and builds one for a failure (the mail would carry it)."""
    import logging

    from django.utils.log import RequireDebugFalse, RequireDebugTrue

    from django_durable import tasks as backend

    tasks_logger = backend._tasks_logger
    console, mail = logging.NullHandler(), logging.NullHandler()
    console.setLevel(logging.INFO)
    console.addFilter(RequireDebugTrue())
    mail.setLevel(logging.ERROR)
    mail.addFilter(RequireDebugFalse())
    kept = tasks_logger.level, tasks_logger.propagate, tasks_logger.handlers
    # As Django's "django" logger has them; not propagated to the root, where pytest's capture hears
    # all (set in the test's body: pytest adds its handler to loggers that do not propagate as a
    # test's phase begins).
    tasks_logger.setLevel(logging.INFO)
    tasks_logger.propagate, tasks_logger.handlers = False, [console, mail]
    try:
        settings.DEBUG = False
        test_tasks.meaning_of_life.enqueue()
        built.clear()
        drain()
        assert built == []
        test_tasks.fails.enqueue()
        built.clear()
        drain()
        assert built == [TaskResultStatus.FAILED]  # read back at its end, for the mail

        settings.DEBUG = True  # the console now prints each line: both results are built
        test_tasks.meaning_of_life.enqueue()
        built.clear()
        drain()
        assert built == [TaskResultStatus.RUNNING, TaskResultStatus.SUCCESSFUL]
    finally:
        tasks_logger.setLevel(kept[0])
        tasks_logger.propagate, tasks_logger.handlers = kept[1], kept[2]


def test_a_cancelled_task_ends_failed_and_never_runs():
    key = str(uuid.uuid4())
    result = test_tasks.record.enqueue(key)
    durable.cancel(result.id)
    drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and ledger.count(key, "ran") == 0


def test_a_task_is_a_run_the_admin_and_the_api_show(admin_client):
    result = test_tasks.echo.enqueue("shown")
    drain()
    page = admin_client.get(f"/admin/django_durable/workflowrun/{result.id}/change/")
    assert page.status_code == 200 and "tests.testapp.tasks.echo" in page.content.decode()
    api = admin_client.get(f"/api/durable/workflows/{result.id}/").json()
    assert (api["workflow"], api["kind"], api["status"], api["result"]) == (
        "tests.testapp.tasks.echo", "task", "completed", {"args": ["shown"], "kwargs": {}})
    workflow = durable.start("tests.echo", 1)
    tasks_only = admin_client.get("/api/durable/workflows/?kind=task").json()["results"]
    assert [run["id"] for run in tasks_only] == [result.id]
    workflows_only = admin_client.get("/api/durable/workflows/?kind=workflow").json()["results"]
    assert [run["id"] for run in workflows_only] == [str(workflow.pk)]
    assert admin_client.get("/api/durable/workflows/?kind=job").status_code == 400
    listed = admin_client.get("/admin/django_durable/workflowrun/?kind=task").content.decode()
    assert str(result.id)[-8:] in listed and workflow.short_id not in listed


# -- worker processes -----------------------------------------------------------------------------


@pytest.mark.every_django
@pytest.mark.timeout(120)
def test_tasks_run_in_worker_processes_that_import_them_by_themselves(start_worker):
    keys = [str(uuid.uuid4()) for _ in range(20)]
    results = [test_tasks.record.enqueue(key) for key in keys]
    results.append(test_tasks.send_email.enqueue("b@example.com"))
    failing = test_tasks.fails.enqueue()
    workers = [start_worker() for _ in range(2)]
    for worker in workers:
        assert worker.wait(90) == 0, worker.log()
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1 and result.worker_ids[0]
    assert all(ledger.count(key, "ran") == 1 for key in keys)
    failing.refresh()
    assert failing.status == TaskResultStatus.FAILED and failing.errors[0].exception_class is ValueError
    assert_settled()


def test_an_operator_retries_a_failed_task_over_http_and_it_runs_again(admin_client):
    key = str(uuid.uuid4())
    result = test_tasks.flaky_once.enqueue(key)
    drain(worker="w-1")
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    response = admin_client.post(f"/api/durable/workflows/{result.id}/retry/")
    assert response.status_code == 202, response.content
    drain(worker="w-2")
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, key)
    assert result.worker_ids == ["w-1", "w-2"] and [e.exception_class for e in result.errors] == [ConnectionError]
    assert ledger.count(key, "attempt") == 2


def test_only_the_tasks_of_a_named_durable_backend_go_to_durable_workers():
    """Issue 30 (a Wagtail site): TASKS keeps its default for the project's other tasks; the tasks
    that name the durable backend are runs, the others never reach a durable worker."""
    from django_durable.catalog import workflows
    from tests.testapp.tasks import not_durable, on_named_backend

    result = on_named_backend.enqueue(21)
    assert result.backend == "durable" and WorkflowRun.objects.filter(pk=result.id).exists()
    drain()
    assert on_named_backend.get_result(result.id).return_value == 42

    other = not_durable.enqueue(5)
    assert other.return_value == 15 and not WorkflowRun.objects.filter(workflow__endswith="not_durable").exists()
    names = {definition["name"] for definition in workflows(shapes=False)}
    assert "tests.testapp.tasks.on_named_backend" in names and "tests.testapp.tasks.not_durable" not in names
