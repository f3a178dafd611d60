"""Failure handling in-process: retries with durable back-off, timeouts, deadlines, workflow attempts."""

import datetime as dt
import os
import time

import pytest

import django_durable as durable
from django_durable import signals
from django_durable.models import Step, Timer, WorkflowRun, WorkItem
from django_durable.testing import clock, drain
from tests.conftest import ledger_counts
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)

SECOND = dt.timedelta(seconds=1)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


failures_left = {}


def flaky(run_id, key, failures, exc_type=ConnectionError):
    """Fail `failures` times for this run, then succeed."""
    ledger.record(run_id, key)
    left = failures_left.setdefault((str(run_id), key), failures)
    if left:
        failures_left[(str(run_id), key)] = left - 1
        raise exc_type(f"attempt failed ({left} failures left)")
    return "ok"


POLICY = durable.RetryPolicy(max_attempts=5, initial_backoff=1, backoff_coefficient=2, max_backoff=60, jitter=0)


@durable.workflow("tests.failures.flaky_twice", retry=POLICY)
def flaky_twice(ctx):
    return ctx.step("call", flaky, ctx.run_id, "call", 2)


def test_a_step_failing_twice_then_succeeding_waits_out_each_backoff():
    with clock() as test_clock:
        start = test_clock.now
        run = durable.start(flaky_twice)
        drain()
        run = run_of(run)
        assert run.status == "waiting"
        assert run.waiting_on.startswith("retry of step 'call' (attempt 2 of 5)")
        assert WorkItem.objects.get(run=run).status == "completed"  # idle: no worker is held
        step = Step.objects.get(run=run, key="call")
        assert (step.status, step.attempts) == ("retrying", 1)
        assert "ConnectionError" in step.error

        test_clock.advance(seconds=0.5)
        assert drain() == 0  # not yet
        test_clock.advance(seconds=0.5)
        drain()  # attempt 2 fails; the next wait is twice as long
        test_clock.advance(seconds=2)
        drain()  # attempt 3 succeeds

    run = run_of(run)
    assert run.status == "completed" and run.get_result() == "ok"
    step = Step.objects.get(run=run, key="call")
    assert (step.status, step.attempts) == ("completed", 3)
    assert ledger_counts(run.pk) == {"call": 3}
    retries = Timer.objects.filter(run=run, kind="retry").order_by("fire_at")
    assert [t.fire_at - start for t in retries] == [1 * SECOND, 3 * SECOND]
    assert {t.status for t in retries} == {"fired"}


def test_the_worker_is_free_during_a_backoff():
    with clock() as test_clock:
        slow = durable.start(flaky_twice)
        drain()
        other = durable.start("tests.three_steps", x=1)
        drain()
        assert run_of(other).status == "completed"
        assert run_of(slow).status == "waiting"
        test_clock.advance(seconds=10)
        drain()
        test_clock.advance(seconds=10)
        drain()
    assert run_of(slow).status == "completed"


def refuse(run_id):
    ledger.record(run_id, "refuse")
    raise durable.NonRetryableError("the customer does not exist")


@durable.workflow("tests.failures.refuses", retry=POLICY)
def refuses(ctx):
    try:
        ctx.step("refuse", refuse, ctx.run_id)
    except durable.StepFailed as failure:
        return {"type": failure.type, "message": failure.message, "attempts": failure.attempts,
                "traceback": "raise durable.NonRetryableError" in failure.traceback}


def test_non_retryable_error_stops_at_the_first_attempt():
    run = durable.start(refuses)
    drain()
    assert run_of(run).get_result() == {
        "type": "django_durable.exceptions.NonRetryableError",
        "message": "the customer does not exist",
        "attempts": 1,
        "traceback": True,
    }
    assert ledger_counts(run.pk) == {"refuse": 1}
    assert not Timer.objects.filter(run=run).exists()


def rate_limited(run_id):
    ledger.record(run_id, "api")
    if ledger.count(run_id, "api") == 1:
        raise durable.RetryAfter(5)
    return "done"


@durable.workflow("tests.failures.rate_limited", retry=POLICY)
def rate_limited_workflow(ctx):
    return ctx.step("api", rate_limited, ctx.run_id)


def test_retry_after_sets_the_next_wait():
    with clock() as test_clock:
        start = test_clock.now
        run = durable.start(rate_limited_workflow)
        drain()
        assert Timer.objects.get(run=run, kind="retry").fire_at - start == 5 * SECOND
        test_clock.advance(seconds=4.9)
        drain()
        assert run_of(run).status == "waiting"
        test_clock.advance(seconds=0.1)
        drain()
    assert run_of(run).get_result() == "done"


@durable.workflow("tests.failures.exhausted")
def exhausted(ctx):
    return ctx.step("call", flaky, ctx.run_id, "call", 10,
                    retry=durable.RetryPolicy(max_attempts=3, initial_backoff=0, jitter=0))


def test_when_attempts_run_out_the_run_fails_with_the_steps_error():
    run = durable.start(exhausted)
    drain()  # a zero back-off retries at once, without a timer
    run = run_of(run)
    assert run.status == "failed"
    error = run.get_error()
    assert error["type"] == "django_durable.exceptions.StepFailed"
    assert "after 3 attempts: ConnectionError" in error["message"]
    assert "raise exc_type" in error["traceback"]
    assert Step.objects.get(run=run, key="call").attempts == 3
    assert ledger_counts(run.pk) == {"call": 3}


def test_step_policy_beats_workflow_policy_beats_the_project_default(settings):
    settings.DURABLE_DEFAULT_RETRY = {"max_attempts": 2, "initial_backoff": 0}

    @durable.workflow("tests.failures.policies", retry=durable.RetryPolicy(max_attempts=3, initial_backoff=0))
    def policies(ctx):
        outcomes = {}
        for key, policy in [("own", durable.RetryPolicy(max_attempts=4, initial_backoff=0)), ("inherited", None)]:
            try:
                ctx.step(key, flaky, ctx.run_id, key, 10, retry=policy)
            except durable.StepFailed as failure:
                outcomes[key] = failure.attempts
        return outcomes

    @durable.workflow("tests.failures.project_default")
    def project_default(ctx):
        try:
            ctx.step("default", flaky, ctx.run_id, "default", 10)
        except durable.StepFailed as failure:
            return failure.attempts

    first = durable.start(policies)
    second = durable.start(project_default)
    drain()
    assert run_of(first).get_result() == {"own": 4, "inherited": 3}
    assert run_of(second).get_result() == 2


def test_lifecycle_signals_follow_the_commits():
    events = []

    def on(name):
        def receiver(sender, **kwargs):
            run = WorkflowRun.objects.get(pk=kwargs["run_id"])
            step = Step.objects.filter(run=run, key=kwargs.get("key", "")).first()
            events.append((name, kwargs["workflow"], kwargs.get("key"), kwargs.get("will_retry"), run.status,
                           step.status if step else None))
        return receiver

    receivers = {
        signals.run_started: on("run_started"),
        signals.step_completed: on("step_completed"),
        signals.step_failed: on("step_failed"),
        signals.run_completed: on("run_completed"),
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver, sender=flaky_twice)
    try:
        with clock() as test_clock:
            run = durable.start(flaky_twice)
            for _ in range(3):
                drain()
                test_clock.advance(seconds=10)
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver, sender=flaky_twice)
    assert run_of(run).status == "completed"
    # Each signal sees in the database what it announces.
    assert events == [
        ("run_started", "tests.failures.flaky_twice", None, None, "running", None),
        ("step_failed", "tests.failures.flaky_twice", "call", True, "waiting", "retrying"),
        ("step_failed", "tests.failures.flaky_twice", "call", True, "waiting", "retrying"),
        ("step_completed", "tests.failures.flaky_twice", "call", None, "completed", "completed"),
        ("run_completed", "tests.failures.flaky_twice", None, None, "completed", None),
    ]


def test_a_receiver_that_raises_does_not_hurt_the_run():
    def broken(sender, **kwargs):
        raise RuntimeError("receiver bug")

    from tests.testapp.workflows import three_steps

    signals.run_completed.connect(broken, sender=three_steps)
    try:
        run = durable.start("tests.three_steps", x=1)
        drain()
    finally:
        signals.run_completed.disconnect(broken, sender=three_steps)
    assert run_of(run).status == "completed"


# -- timeouts -----------------------------------------------------------------------------------


def sleeps(run_id, seconds):
    ledger.record(run_id, "sleeps")
    time.sleep(seconds)
    return "woke"


def reads_a_pipe(run_id):
    ledger.record(run_id, "reads")
    read_end, write_end = os.pipe()
    try:
        return os.read(read_end, 1)  # blocks: nobody ever writes
    finally:
        os.close(read_end)
        os.close(write_end)


@durable.workflow("tests.failures.slow_step")
def slow_step(ctx, which):
    once = durable.RetryPolicy(max_attempts=1)
    try:
        if which == "sleep":
            ctx.step("slow", sleeps, ctx.run_id, 30, timeout=0.3, retry=once)
        else:
            ctx.step("slow", reads_a_pipe, ctx.run_id, timeout=0.3, retry=once)
    except durable.StepFailed as failure:
        return failure.type
    return "not interrupted"


@pytest.mark.parametrize("which", ["sleep", "pipe"])
def test_a_step_past_its_timeout_is_interrupted(which):
    run = durable.start(slow_step, which)
    started = time.monotonic()
    drain()
    assert time.monotonic() - started < 20  # (not interrupted, it sleeps 30 s or reads forever)
    assert run_of(run).get_result() == "django_durable.exceptions.StepTimeout"
    step = Step.objects.get(run=run, key="slow")
    assert step.status == "failed"
    assert step.deadline_at is not None


@durable.workflow("tests.failures.timeout_then_retry")
def timeout_then_retry(ctx):
    def first_slow(run_id):
        ledger.record(run_id, "t")
        if ledger.count(run_id, "t") == 1:
            time.sleep(30)
        return "second attempt"

    return ctx.step("t", first_slow, ctx.run_id, timeout=0.3,
                    retry=durable.RetryPolicy(max_attempts=2, initial_backoff=0))


def test_a_timeout_counts_as_a_failed_attempt():
    run = durable.start(timeout_then_retry)
    drain()
    assert run_of(run).get_result() == "second attempt"
    assert Step.objects.get(run=run, key="t").attempts == 2


# -- the workflow's deadline and attempts --------------------------------------------------------


@durable.workflow("tests.failures.deadline_while_waiting", timeout=dt.timedelta(minutes=1))
def deadline_while_waiting(ctx):
    return ctx.step("later", flaky, ctx.run_id, "later", 10,
                    retry=durable.RetryPolicy(max_attempts=5, initial_backoff=3600, max_backoff=7200))


def test_a_run_past_its_deadline_while_waiting_ends_timed_out_and_nothing_fires_after():
    with clock() as test_clock:
        run = durable.start(deadline_while_waiting)
        drain()
        assert run_of(run).status == "waiting"
        test_clock.advance(minutes=1)
        drain()
        run = run_of(run)
        assert run.status == "timed_out"
        assert run.get_error()["type"] == "django_durable.exceptions.WorkflowTimeout"
        assert set(Timer.objects.filter(run=run).values_list("kind", "status")) == {
            ("deadline", "fired"), ("retry", "cancelled")
        }
        test_clock.advance(hours=2)
        assert drain() == 0
    assert run_of(run).status == "timed_out"
    assert ledger_counts(run.pk) == {"later": 1}


@durable.workflow("tests.failures.deadline_while_running", timeout=0.5)
def deadline_while_running(ctx):
    ctx.step("slow", sleeps, ctx.run_id, 30)
    ctx.step("never", sleeps, ctx.run_id, 0)


def test_a_run_past_its_deadline_while_running_ends_timed_out():
    run = durable.start(deadline_while_running)
    started = time.monotonic()
    drain()
    assert time.monotonic() - started < 20  # (not interrupted, its step sleeps 30 s)
    run = run_of(run)
    assert run.status == "timed_out"
    assert ledger_counts(run.pk) == {"sleeps": 1}
    assert not Step.objects.filter(run=run, key="never").exists()


@durable.workflow("tests.failures.retried_run", max_attempts=2,
                  retry=durable.RetryPolicy(initial_backoff=1, jitter=0))
def retried_run(ctx):
    first = ctx.step("first", ledger.record, ctx.run_id, "first")
    if ctx.attempt == 1:
        raise RuntimeError("the workflow code hit a bug")
    return [first, ctx.attempt]


def test_a_workflow_that_raises_goes_again_from_its_last_checkpoint():
    with clock() as test_clock:
        run = durable.start(retried_run)
        drain()
        run = run_of(run)
        assert (run.status, run.attempt) == ("waiting", 2)
        assert run.waiting_on.startswith("retry of the run (attempt 2 of 2)")
        assert run.get_error()["type"] == "RuntimeError"
        test_clock.advance(seconds=1)
        drain()
    run = run_of(run)
    assert run.status == "completed"
    assert run.get_result() == [None, 2]
    assert ledger_counts(run.pk) == {"first": 1}  # the checkpoint was kept


@durable.workflow("tests.failures.step_fails_then_run_retries", max_attempts=2,
                  retry=durable.RetryPolicy(max_attempts=1, initial_backoff=0))
def step_fails_then_run_retries(ctx):
    ctx.step("kept", ledger.record, ctx.run_id, "kept")
    return ctx.step("flaky", flaky, ctx.run_id, "flaky", 1)


def test_a_run_retry_runs_its_failed_steps_again_and_keeps_the_completed_ones():
    run = durable.start(step_fails_then_run_retries)
    drain()
    run = run_of(run)
    assert (run.status, run.attempt, run.get_result()) == ("completed", 2, "ok")
    assert ledger_counts(run.pk) == {"kept": 1, "flaky": 2}


def test_the_step_timeout_never_fires_inside_the_engines_checkpoint_of_an_atomic_step():
    """The step returns at once; the engine's work after it, in the step's transaction, is slow
    (a fault point where the step has returned and its checkpoint is not yet written), past the
    step's 1 s timeout: the step completed and stays completed, run once."""
    from django_durable import faults
    from tests.testapp.models import Payment

    run = durable.start("tests.atomic_timed")
    faults.arm("after_step_return=sleep:1.5@pay")
    try:
        drain()
    finally:
        faults.arm("")
    assert durable.wait(run.pk, timeout=1) == {"amount": 3}
    assert ledger_counts(run.pk) == {"pay": 1}
    assert Payment.objects.filter(run_id=run.pk).count() == 1


def test_a_step_inside_a_step_does_not_cancel_the_outer_steps_timeout():
    import time

    started = time.monotonic()
    run = durable.start("tests.nested_steps", nap=30)
    drain()
    assert durable.wait(run.pk, timeout=1) == "django_durable.exceptions.StepTimeout"
    assert time.monotonic() - started < 20  # interrupted at its 1 s timeout, not after the 30 s nap
    assert ledger_counts(run.pk) == {"inner": 1}


def test_an_interrupt_as_a_steps_alarm_arms_leaves_nothing_of_the_step_behind(monkeypatch):
    """An interrupt that lands while a step's alarm arms (an outer step's deadline passing then)
    unwinds the alarm before the step's code runs: no frame of it is left for the next step to
    find itself nested in, and the claim's step deadline is what it was."""
    from types import SimpleNamespace

    from django_durable.engine import alarm

    claim = SimpleNamespace(step_deadline=None, step_active=None, cancel_sent_at=None,
                            db_seconds_until=lambda at: 60.0)
    calls = []

    def interrupted_once():
        calls.append(1)
        if len(calls) == 1:
            raise durable.StepTimeout("an outer step's deadline passed")

    monkeypatch.setattr(alarm, "_arm", interrupted_once)
    with pytest.raises(durable.StepTimeout):
        with alarm.Alarm(SimpleNamespace(claim=claim, deadline=None))(dt.datetime.now(dt.timezone.utc), "charge"):
            pytest.fail("the step's code ran")
    assert alarm._frames == []
    assert (claim.step_deadline, claim.step_active) == (None, None)
