"""A `django.tasks` backend: tasks run on durable workers, from the same workpool as workflows.

    TASKS = {"default": {"BACKEND": "django_durable.tasks.DurableBackend"}}

Django 6 ships the `django.tasks` API; on Django 5.2 the `django-tasks` backport provides it
(`pip install "django-durable-workflows[tasks]"`). A task is stored as a run of a one-call
workflow: the worker claims it, calls the function and records its return value with the run's
end, in the statement that claims its next item. No journal entry is written, so a task costs a
start and a claim-and-finish and nothing more. It gets what every run gets: its queue's limits
(DURABLE_QUEUES), priorities, `run_after`, cancellation, the admin, the REST API, `durable.wait()`.

Beyond the standard options, `@task` takes `retry` (a durable.RetryPolicy, or how many attempts
in all with the default back-off) and `timeout` (seconds one attempt may run):

    @task(queue_name="emails", retry=3, timeout=30)
    def send_receipt(order_id): ...

A worker that dies mid-task leaves the task to be run again (at least once, as for any step):
make tasks idempotent, or make them steps of a workflow when a side effect must not repeat.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import logging
import uuid
from dataclasses import dataclass
from functools import cached_property

from . import conf, registry, serialization, telemetry
from .exceptions import Cancelled, InvalidArguments, NotSerializable
from .interrupts import CancelRequested
from .models import WorkflowEvent, WorkflowRun
from .retry import RetryPolicy

try:  # Django 6
    from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus
    from django.tasks import Task as _Task
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import log_task_finished, log_task_started, task_enqueued, task_finished, task_started
    from django.tasks.signals import logger as _tasks_logger
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task as _Task
    from django_tasks.base import TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import log_task_finished, log_task_started, task_enqueued, task_finished, task_started
    from django_tasks.signals import logger as _tasks_logger

__all__ = ["DurableBackend", "DurableTask"]

Status = WorkflowRun.Status

# A run's status as a task's. Waiting is a task's run_after not reached yet, or its next attempt's
# back-off; every ending but completed (failed, cancelled, timed out) is FAILED.
STATUSES = {
    Status.PENDING: TaskResultStatus.READY,
    Status.WAITING: TaskResultStatus.READY,
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.COMPLETED: TaskResultStatus.SUCCESSFUL,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableTask(_Task):
    """A task of the durable backend: the standard fields, its retries and its timeout."""

    retry: RetryPolicy | int | None = None  # a policy, or attempts in all (default back-off); None: once
    timeout: float | None = None  # seconds one attempt may run

    @property
    def policy(self) -> RetryPolicy:
        if isinstance(self.retry, RetryPolicy):
            return self.retry
        return RetryPolicy(max_attempts=self.retry or 1)


class TaskDefinition(registry.WorkflowDefinition):
    """The registry's entry for a task: a workflow of one call, without a journal."""

    kind = "task"

    @cached_property
    def _task_signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self.fn.task.func)
        except (TypeError, ValueError):  # a callable without one: nothing to check against
            return None

    def check_arguments(self, args, kwargs: dict) -> None:
        """Refuse arguments the task function cannot take before anything is stored."""
        task, signature = self.fn.task, self._task_signature
        if signature is None:
            return
        try:
            signature.bind(*((None,) if task.takes_context else ()), *args, **kwargs)
        except TypeError as exc:
            raise InvalidArguments(f"Task {self.name!r} cannot be enqueued with these arguments: {exc}.") from None

    def ended(self, run_id, status: str, result: str | None, error: str | None) -> None:
        """task_finished for the run's end: it succeeded, or it failed (a cancel carries no error)."""
        succeeded = status == Status.COMPLETED
        _finished(self.fn, run_id, succeeded=succeeded, result=result if succeeded else None,
                  error=error if status not in (Status.COMPLETED, Status.CANCELLED) else None)

    def refused_result(self, exc: Exception) -> Exception:
        """A return value that is not JSON fails the task with a TypeError, as django.tasks says."""
        if not isinstance(exc, NotSerializable):
            return exc
        refused = TypeError(f"The task's return value is not JSON serializable: {exc}")
        refused.__cause__ = exc
        return refused


class _Call:
    """The workflow function of a task: one call per attempt, under the attempt's timeout."""

    def __init__(self, task):
        self.task = task
        self.__module__, self.__qualname__ = task.func.__module__, task.func.__qualname__
        self.__name__ = task.func.__name__
        # What Task.call() runs, decided once: it asks iscoroutinefunction() of the same function
        # at every call (six Python calls a task).
        self.calls = task.call if inspect.iscoroutinefunction(task.func) else task.func

    def __call__(self, ctx, *args, **kwargs):
        task, session = self.task, ctx._session
        claim = session.claim
        if task.takes_context or heard(logging.INFO, (task_started, log_task_started),
                                       (task_finished, log_task_finished)):
            backend = task.get_backend()
            earlier = _attempts(ctx.run_id, max(ctx.attempt, claim.attempts))  # a retry's, or a lost worker's
            workers = [attempt["worker"] for attempt in earlier] + [claim.worker]
            running = TaskResult(
                task=task, id=str(ctx.run_id), status=TaskResultStatus.RUNNING, enqueued_at=None,
                started_at=claim.db_time, finished_at=None, last_attempted_at=claim.db_time, args=list(args),
                kwargs=dict(kwargs), backend=backend.alias, errors=[], worker_ids=workers,
            )
            if len(_running) > 1000:  # attempts that ended in a retry, never finished here
                _running.clear()
            _running[str(ctx.run_id)] = running
            task_started.send(type(backend), task_result=running)
            if task.takes_context:
                args = (TaskContext(task_result=running), *args)
        timeout = getattr(task, "timeout", None)
        deadline = session.now() + dt.timedelta(seconds=timeout) if timeout else None
        try:
            with session.alarm(deadline, "task"):
                return self.calls(*args, **kwargs)
        except Cancelled:
            if claim.cancel_requested:
                raise CancelRequested() from None  # the run ends cancelled
            raise


class DurableBackend(BaseTaskBackend):
    """Runs `django.tasks` tasks on django-durable's workers (see this module's documentation)."""

    task_class = DurableTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        # The tasks (by identity; a Task is frozen) this backend has validated: enqueue() checks
        # each once, not at every call (a tenth of an enqueue's CPU).
        self._validated: dict[int, _Task] = {}
        if "QUEUES" not in params:
            # The queues a task may name, unless TASKS says: "default" and those of DURABLE_QUEUES.
            self.queues = {DEFAULT_TASK_QUEUE_NAME, *conf.get("QUEUES")}

    # OPTIONS this backend reads: none yet. Others (django-tasks-db's id_function, a typo) are
    # refused by check(), not ignored: a run's id is always a UUIDv7 (docs/guides/queues-and-tasks.md).
    OPTIONS: frozenset[str] = frozenset()

    def check(self, **kwargs):
        from django.apps import apps
        from django.core import checks

        yield from super().check(**kwargs)
        if not apps.is_installed("django_durable"):
            yield checks.Error(
                f"The task backend {self.alias!r} stores its tasks with django_durable, which is not installed.",
                hint="Add 'django_durable' to INSTALLED_APPS.", obj=self, id="django_durable.E013",
            )
        if unknown := sorted(set(self.options) - self.OPTIONS):
            yield checks.Error(
                f"The task backend {self.alias!r} does not know the OPTIONS {', '.join(map(repr, unknown))}.",
                hint="DurableBackend takes no OPTIONS: remove them (a task's id is always a UUIDv7, see "
                     "docs/guides/queues-and-tasks.md).", obj=self, id="django_durable.E014",
            )

    def validate_task(self, task) -> None:
        super().validate_task(task)
        if isinstance(task, DurableTask):
            retry = task.retry
            if not (retry is None or isinstance(retry, RetryPolicy) or (type(retry) is int and retry >= 1)):
                raise InvalidTask(f"retry must be a durable.RetryPolicy or a number of attempts >= 1, not {retry!r}.")
            timeout = task.timeout
            if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                        or timeout <= 0):
                raise InvalidTask(f"timeout must be a positive number of seconds, not {timeout!r}.")
        _register(task)

    def enqueue(self, task, args, kwargs):
        """Store a run of the task, ready (or waiting for `run_after`); inside the caller's
        transaction.atomic() it commits or rolls back with it."""
        from .workpool.runs import create_run

        if self._validated.get(id(task)) is not task:
            self.validate_task(task)
            if len(self._validated) >= 256:  # .using() makes a new task at each call
                self._validated.clear()
            self._validated[id(task)] = task
        run = create_run(_register(task), list(args), dict(kwargs), queue=task.queue_name,
                         priority=task.priority, run_at=task.run_after)
        result = TaskResult(
            task=task, id=str(run.pk), status=TaskResultStatus.READY, enqueued_at=run.created_at, started_at=None,
            finished_at=None, last_attempted_at=None, args=list(args), kwargs=dict(kwargs), backend=self.alias,
            errors=[], worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id):
        try:
            pk = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        run = WorkflowRun.objects.using(conf.get("DATABASE")).filter(pk=pk).first()
        task = _task_of(run.workflow) if run is not None else None
        if task is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result_of(run, task)

    def result_of(self, run: WorkflowRun, task) -> TaskResult:
        """The TaskResult a task's run stands for."""
        arguments = serialization.decode(run.input)
        earlier = _attempts(run.pk, None)
        workers = [attempt["worker"] for attempt in earlier]
        # The current attempt's worker, once it has claimed the run since the last attempt ended.
        if run.last_worker and (not earlier or (run.last_claimed_at or earlier[-1]["at"]) > earlier[-1]["at"]):
            workers.append(run.last_worker)
        errors = [error for attempt in earlier if (error := _task_error(attempt["error"]))]
        if run.status not in STATUSES and (error := _task_error(run.get_error())):
            errors.append(error)
        if (run.priority, run.queue, run.scheduled_at) != (task.priority, task.queue_name, task.run_after):
            # As enqueued: what .using() changed (not validated again: it was at enqueue).
            task = dataclasses.replace(task, priority=run.priority, queue_name=run.queue, run_after=run.scheduled_at)
        result = TaskResult(
            task=task, id=str(run.pk), status=STATUSES.get(run.status, TaskResultStatus.FAILED),
            enqueued_at=run.created_at, started_at=run.started_at, finished_at=run.finished_at,
            last_attempted_at=run.last_claimed_at, args=arguments.get("args", []),
            kwargs=arguments.get("kwargs", {}), backend=self.alias, errors=errors, worker_ids=workers,
        )
        if run.status == Status.COMPLETED:
            object.__setattr__(result, "_return_value", run.get_result())
        return result


def _attempts(run_id, attempt: int | None) -> list[dict]:
    """The attempts before the current one, oldest first: their worker, error and end (the audit
    trail: an attempt that ended, or whose worker was lost). A worker starting its first attempt
    and first delivery skips the read (None: read anyway; an operator's retry starts the count
    again at 1)."""
    if attempt is not None and attempt <= 1:
        return []
    ended = WorkflowEvent.objects.using(conf.get("DATABASE")).filter(
        run_id=run_id, type__in=(WorkflowEvent.Type.ATTEMPT_ENDED, WorkflowEvent.Type.WORKER_LOST))
    return [{"worker": data.get("worker") or "", "error": data.get("error"), "at": at}
            for at, data in ended.order_by("at", "id").values_list("at", "data")]


def _task_error(error) -> TaskError | None:
    """A recorded error ({"type", "message", "traceback"}) as django.tasks shows it."""
    if not error:
        return None
    kind = str(error.get("type") or "Exception")
    return TaskError(exception_class_path=kind if "." in kind else f"builtins.{kind}",
                     traceback=str(error.get("traceback") or error.get("message") or ""))


_tasks: dict[str, _Task] = {}  # by module path: the task as its decorator made it


def _register(task) -> TaskDefinition:
    """Make the task startable by its module path in this process (a worker registers it when it
    imports the task's module); return its definition. Its variants made with .using() share the
    entry: what they change (queue, priority, run_after) goes with each enqueued run."""
    name = task.module_path
    known = registry.find(name)
    if known is not None and not isinstance(known, TaskDefinition):
        raise InvalidTask(f"{name!r} is the name of a registered workflow; a task cannot take it.")
    if known is not None and known.fn.task.func is task.func:
        return known
    _tasks[name] = task
    policy = task.policy if isinstance(task, DurableTask) else RetryPolicy(max_attempts=1)
    definition = TaskDefinition(name=name, fn=_Call(task), queue=task.queue_name, priority=task.priority,
                                max_attempts=policy.max_attempts, retry=policy)
    registry.register(definition)
    return definition


def _task_of(name: str):
    """The task registered under `name` in this process (importing its module if it belongs to an
    installed app), or None: a workflow's run, or a task this process cannot know."""
    definition = registry.find(name) or load(name)
    return definition.fn.task if isinstance(definition, TaskDefinition) else None


def load(name: str) -> registry.WorkflowDefinition | None:
    """Import the module of the task `name` ("app.tasks.send_receipt") if it is one of an
    installed app's modules, so that its tasks register; return its definition, or None.

    Every process imports the installed apps' `tasks` modules at start-up (apps.py); this finds
    tasks that live elsewhere in an app. Nothing outside the installed apps is imported from a name.
    """
    from django.apps import apps
    from django.utils.module_loading import import_string

    module = name.rpartition(".")[0]
    if not any(module == app.name or module.startswith(app.name + ".") for app in apps.get_app_configs()):
        return None
    try:
        import_string(name)
    except ImportError:
        return None
    return registry.find(name)


registry.add_finder(load)  # a worker finds a task whose module nothing imported yet

_running: dict[str, TaskResult] = {}  # by run id: the attempt this worker process runs now


def heard(level: int, *sent: tuple) -> bool:
    """Whether sending one of the (signal, own receiver) pairs `sent` reaches anyone: a receiver
    besides django.tasks' own logging one, or that one with a handler that would write its line at
    `level`. A worker builds the TaskResults of task_started and task_finished only then (and reads
    a retried task's earlier attempts for them): for nobody they were a third of what a task cost
    it beyond its call. With Django's default LOGGING and DEBUG off, the logger is enabled at INFO
    but every handler drops the line, so a task's start and success are heard by nobody, and a
    failure by the admins' mail."""
    for signal, own in sent:
        own_id = id(own)
        for lookup, *_ in signal.receivers:
            if lookup[0] != own_id:
                return True
    return telemetry.emits(_tasks_logger, level)


def _finished(call: _Call, run_id, *, succeeded: bool, result: str | None, error: str | None) -> None:
    """task_finished, once a task's run has ended (after its end was committed), given its result
    or error as stored (JSON text): read only when someone hears it."""
    task = call.task
    running = _running.pop(str(run_id), None) if _running else None  # filled only while someone hears
    if not heard(logging.INFO if succeeded else logging.ERROR, (task_finished, log_task_finished)):
        return
    result, error = serialization.decode(result), serialization.decode(error)
    backend = task.get_backend()
    if running is None:  # ended outside an attempt of this process (cancelled before it ran): read it
        run = WorkflowRun.objects.using(conf.get("DATABASE")).filter(pk=run_id).first()
        if run is not None:
            task_finished.send(type(backend), task_result=backend.result_of(run, task))
        return
    # The attempt that just ended, as this worker saw it: no read of what it just wrote.
    from django.utils import timezone

    ended = TaskResult(
        task=task, id=running.id, status=TaskResultStatus.SUCCESSFUL if succeeded else TaskResultStatus.FAILED,
        enqueued_at=running.enqueued_at, started_at=running.started_at, finished_at=timezone.now(),
        last_attempted_at=running.last_attempted_at, args=running.args, kwargs=running.kwargs,
        backend=running.backend, errors=[e for e in [_task_error(error)] if e is not None and not succeeded],
        worker_ids=running.worker_ids,
    )
    if succeeded:
        object.__setattr__(ended, "_return_value", result)
    task_finished.send(type(backend), task_result=ended)


