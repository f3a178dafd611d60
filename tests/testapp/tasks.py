"""django.tasks tasks of the test suite, run by django_durable.tasks.DurableBackend."""

import sys
import threading
import time

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the backport
    from django_tasks import TaskContext, task

import django_durable as durable
from tests.testapp import ledger


@task()
def noop(*args, **kwargs):
    return None


@task()
def imported(*modules):
    """Which of `modules` the process running this task has imported."""
    return [name for name in modules if name in sys.modules]


@task()
def meaning_of_life():
    return 42


@task()
async def add_async(a, b):
    return a + b


@task()
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task()
def fails(message="This task failed due to ValueError"):
    raise ValueError(message)


@task()
def exits():
    raise SystemExit("This task failed due to SystemExit")


@task()
def complex_exception():
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value():
    return lambda: True  # cannot be stored


@task(takes_context=True)
def my_id(context: TaskContext):
    return {"id": context.task_result.id, "attempt": context.attempt}


# A back-off far longer than any test: the test fires it with durable.wake(), so a slow machine
# can never see the retry happen inside the first drain.
@task(retry=durable.RetryPolicy(max_attempts=3, initial_backoff=600, jitter=0), takes_context=True)
def fails_once(context: TaskContext, key):
    """Fails on its first attempt, succeeds on the next: the ledger counts the attempts."""
    ledger.record(key, "attempt")
    if context.attempt == 1:
        raise ConnectionError("the first attempt fails")
    return context.attempt


@task(retry=durable.RetryPolicy(max_attempts=3, initial_backoff=0.01, non_retryable=(KeyError,)))
def never_retried(key):
    ledger.record(key, "attempt")
    raise KeyError(key)


@task(timeout=0.3)
def sleeps(seconds):
    time.sleep(seconds)
    return seconds


@task(queue_name="emails", priority=5)
def send_email(to):
    ledger.record(to, "sent")
    return to


@task()
def record(key, step="ran"):
    ledger.record(key, step)
    return key


# Opened by a test of the same process: held_at_gate() runs until then (a minute at most). AT_GATE
# is set once one has begun.
GATE = threading.Event()
AT_GATE = threading.Event()


@task()
def held_at_gate(key):
    """record(), once GATE opens: a task a test keeps running for as long as it looks at it."""
    AT_GATE.set()
    GATE.wait(timeout=60)
    ledger.record(key, "ran")
    return key


@task()
def dawdle(key, seconds=0.005):
    """record(), taking `seconds` (still quick enough for a worker's batches): a worker draining
    them spends its time in the tasks, not in its statements (tests/harness/partition.py)."""
    ledger.record(key, "ran")
    time.sleep(seconds)
    return key


@task()
def flaky_once(key):
    """Fails the first time it runs for `key` (no retry policy: an operator retries it)."""
    ledger.record(key, "attempt")
    if ledger.count(key, "attempt") == 1:
        raise ConnectionError("the first run fails")
    return key


@task(backend="durable")
def on_named_backend(x):
    """On the backend named "durable" beside the default: run by durable workers."""
    return x * 2


@task(backend="elsewhere")
def not_durable(x):
    """On another backend (Django's immediate one): durable workers never see it."""
    return x * 3


# The conformance suite's tasks (tests/test_task_backend_contract.py).

@task()
def interrupts():
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task()
def calls_exit():
    exit(1)


@task()
def sleeps_then_records(seconds, key):
    ledger.record(key, "started")
    time.sleep(seconds)
    ledger.record(key, "finished")
    return key


@task(takes_context=True)
def checks_context(context: TaskContext, attempt):
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt


@task()
async def noop_async(*args, **kwargs):
    return None


@task()
def soak_task(key, millis):
    """The tasks soak's task (tests/harness/tasks_soak.py): noted in the ledger, then `millis` of work."""
    ledger.record(key, "soak")
    time.sleep(millis / 1000)
    return key
