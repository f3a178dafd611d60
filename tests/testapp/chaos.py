"""The workflows of the chaos soak (tests/harness/chaos.py): every kind of work, each with a result it can check.

Every step notes its execution in the chaos ledger, a file no crash or rollback can undo:
``run key attempt pid group started`` (epoch seconds, this machine's clock, which is also the
database's). Steps that touch the database retry long enough to outlast a restart of it.
"""

import os
import time

import django_durable as durable

from .models import Payment

# Steps that use the database: a restart of PostgreSQL must not use up their attempts.
PATIENT = durable.RetryPolicy(max_attempts=30, initial_backoff=0.2, backoff_coefficient=1.5, max_backoff=2.0)


def note():
    """Append this execution to the chaos ledger."""
    step = durable.current_step()
    line = (f"{step.run_id} {step.key} {step.attempt} {os.getpid()} {os.environ.get('DURABLE_CHAOS_GROUP', '-')} "
            f"{time.time()!r}\n").encode()
    fd = os.open(os.environ["DURABLE_CHAOS_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def work(value, pause=0.05):
    note()
    time.sleep(pause)
    return value


def pay(run_id, index):
    note()
    Payment.objects.create(run_id=run_id, amount=index)
    time.sleep(0.02)
    return index


def flaky(failures):
    """Fail the first `failures` attempts."""
    note()
    attempt = durable.current_step().attempt
    if attempt <= failures:
        raise ConnectionError(f"attempt {attempt} fails on purpose")
    return attempt


def db_clock():
    note()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def square(x):
    note()
    time.sleep(0.05)
    return x * x


def undo(result):
    note()
    return {"undone": result}


def fail(reason):
    note()
    raise durable.NonRetryableError(reason)


@durable.workflow("chaos.steps")
def steps(ctx, n):
    return sum(ctx.step(f"s{i}", work, i) for i in range(n))


@durable.workflow("chaos.atomic")
def atomic(ctx, n):
    return [ctx.step(f"pay{i}", pay, ctx.run_id, i, atomic=True, retry=PATIENT) for i in range(n)]


@durable.workflow("chaos.retry")
def retry(ctx, failures):
    policy = durable.RetryPolicy(max_attempts=failures + 1, initial_backoff=0.2, jitter=0)
    return ctx.step("flaky", flaky, failures, retry=policy)


@durable.workflow("chaos.sleep")
def sleep(ctx, seconds):
    before = ctx.step("t0", db_clock, retry=PATIENT)
    ctx.sleep("nap", seconds)
    return [before, ctx.step("t1", db_clock, retry=PATIENT)]


@durable.workflow("chaos.signals")
def signals(ctx, count):
    ctx.step("warm-up", work, 0, 0.3)
    received = []
    for i in range(count):
        received.append(ctx.wait_for_signal("go"))
        ctx.step(f"after{i}", work, i)
    return received


@durable.workflow("chaos.fanout")
def fanout(ctx, n):
    return ctx.map("sq", square, list(range(n)))


@durable.workflow("chaos.child")
def child(ctx, n):
    return ctx.step("c", work, n * 10)


@durable.workflow("chaos.parent")
def parent(ctx, n):
    first = ctx.step("p", work, n)
    return first + ctx.child("kid", child, n)


@durable.workflow("chaos.saga")
def saga(ctx):
    ctx.step("charge", work, "charged", compensate=undo)
    ctx.step("reserve", work, "reserved", compensate=undo)
    try:
        ctx.step("ship", fail, "no courier", retry=durable.RetryPolicy(max_attempts=1))
    except durable.StepFailed:
        ctx.rollback()
        return "rolled back"
    return "shipped"


def expected(kind: str, arg):
    """The result a run of `kind` started with `arg` must end with (None: checked otherwise)."""
    return {
        "steps": lambda n: sum(range(n)),
        "atomic": lambda n: list(range(n)),
        "retry": lambda failures: failures + 1,
        "sleep": lambda seconds: None,
        "signals": lambda count: [f"g{i}" for i in range(count)],
        "fanout": lambda n: [i * i for i in range(n)],
        "parent": lambda n: n + n * 10,
        "saga": lambda _: "rolled back",
    }[kind](arg)
