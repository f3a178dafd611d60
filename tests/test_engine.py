"""The engine in-process: replay, memoized steps, recorded values, outcomes and fencing."""

import datetime as dt
import uuid

import pytest
from django.db import transaction
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable import workpool
from django_durable.engine.replay import advance
from django_durable.interrupts import LeaseLost
from django_durable.models import Step, WorkflowRun, WorkItem
from django_durable.testing import drain
from tests.conftest import ledger_counts
from tests.testapp import ledger
from tests.testapp.models import Payment

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


def test_a_three_step_workflow_completes_with_its_result_and_journal():
    run = durable.start("tests.three_steps", x=5)
    assert run.status == "pending"
    assert drain() == 1
    run = run_of(run)
    assert run.status == "completed"
    assert run.get_result() == [5, 6, 7]
    assert run.started_at is not None and run.finished_at >= run.started_at
    steps = list(run.steps.order_by("seq").values_list("seq", "key", "status", "result"))
    assert steps == [(1, "a", "completed", "5"), (2, "b", "completed", "6"), (3, "c", "completed", "7")]
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}
    assert not WorkItem.objects.filter(run=run).exists()  # its end deleted its work item


class SimulatedCrash(BaseException):
    """Stands in for the worker process dying mid-step."""


crash_at = set()


def crashing_step(run_id, name):
    ledger.record(run_id, name)
    if name in crash_at:
        crash_at.discard(name)
        raise SimulatedCrash(name)
    return name


@durable.workflow("tests.engine.crashy")
def crashy(ctx):
    stamp = ctx.now()
    token = ctx.uuid()
    first = ctx.step("first", crashing_step, ctx.run_id, "first")
    second = ctx.step("second", crashing_step, ctx.run_id, "second")
    return {"stamp": stamp, "token": token, "steps": [first, second]}


def expire_claims():
    WorkItem.objects.filter(status="processing").update(
        claim_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc)
    )


def test_replay_after_a_crash_reuses_recorded_steps_and_values():
    run = durable.start(crashy)
    crash_at.add("second")
    with pytest.raises(SimulatedCrash):
        drain()
    recorded = {s.key: s.get_result() for s in Step.objects.filter(run=run)}
    assert set(recorded) == {"now:0", "uuid:0", "first"}
    assert WorkItem.objects.get(run=run).status == "processing"

    expire_claims()
    assert workpool.reap(db="default") == 1
    assert drain() == 1
    run = run_of(run)
    assert run.status == "completed"
    result = run.get_result()
    assert result["stamp"] == recorded["now:0"] and isinstance(result["stamp"], dt.datetime)
    assert result["token"] == recorded["uuid:0"] and isinstance(result["token"], uuid.UUID)
    assert ledger_counts(run.pk) == {"first": 1, "second": 2}
    assert not WorkItem.objects.filter(run=run).exists()  # its delivery count went with it at the end


def test_each_new_step_costs_one_query():
    def queries_for(n):
        run = durable.start("tests.trivial", n=n)
        from django.db import connection

        with CaptureQueriesContext(connection) as captured:
            drain()
        assert run_of(run).get_result() == sum(range(n))
        return len(captured.captured_queries)

    # What a worker does once a second (read the limits set at runtime, look for ready work from
    # the start of the queue) adds a statement to a drain that happens to cross that second, as
    # one on a loaded machine may: the fewest of three drains of each length is what steps cost.
    assert min(queries_for(20) for _ in range(3)) - min(queries_for(10) for _ in range(3)) == 10


def test_a_replayed_step_costs_no_query():
    durable.start(crashy)
    crash_at.add("second")
    with pytest.raises(SimulatedCrash):
        drain()
    expire_claims()
    workpool.reap(db="default")
    from django.db import connection

    with CaptureQueriesContext(connection) as captured:
        drain()
    statements = [q["sql"] for q in captured.captured_queries]
    # Three recorded entries were replayed; only the one new step was written.
    assert sum("INSERT INTO durable_step" in sql for sql in statements) == 1


def failing_step(message):
    raise ValueError(message)


@durable.workflow("tests.engine.catches")
def catches(ctx):
    try:
        ctx.step("fails", failing_step, "no paper", retry=durable.RetryPolicy(max_attempts=1))
    except durable.StepFailed as failure:
        caught = [failure.type, failure.message]
    return ctx.step("after", str.upper, caught[1])


def test_a_failed_step_raises_step_failed_which_the_workflow_may_catch():
    run = durable.start(catches)
    drain()
    run = run_of(run)
    assert run.status == "completed"
    assert run.get_result() == "NO PAPER"
    failed = Step.objects.get(run=run, key="fails")
    assert failed.status == "failed"
    assert "ValueError" in failed.error and "no paper" in failed.error


@durable.workflow("tests.engine.raises")
def raises(ctx):
    ctx.step("ok", str, 1)
    raise KeyError("missing thing")


def test_a_raising_workflow_ends_failed_with_type_message_and_traceback():
    run = durable.start(raises)
    drain()
    run = run_of(run)
    assert run.status == "failed"
    error = run.get_error()
    assert error["type"] == "KeyError"
    assert "missing thing" in error["message"]
    assert "raise KeyError" in error["traceback"]
    with pytest.raises(durable.WorkflowFailed, match="KeyError"):
        durable.wait(run.pk, timeout=1)


@durable.workflow("tests.engine.bad_result")
def bad_result(ctx):
    return ctx.step("s", lambda: {"when": {1, 2}})


def test_a_step_result_that_is_not_json_fails_the_step_naming_the_type():
    run = durable.start(bad_result)
    drain()
    run = run_of(run)
    assert run.status == "failed"
    step = Step.objects.get(run=run, key="s")
    assert step.status == "failed"
    assert "result of step 's'['when'] is of type builtins.set" in step.error


@durable.workflow("tests.engine.bad_return")
def bad_return(ctx):
    return object()


def test_a_workflow_result_that_is_not_json_fails_the_run():
    run = durable.start(bad_return)
    drain()
    run = run_of(run)
    assert run.status == "failed"
    assert "workflow result is of type builtins.object" in run.get_error()["message"]


def test_start_refuses_unknown_workflows_and_bad_input_without_writing():
    with pytest.raises(durable.WorkflowNotFound, match="'os.system'"):
        durable.start("os.system", "rm -rf /")
    with pytest.raises(durable.NotSerializable, match=r"input\['kwargs'\]\['when'\] is of type builtins.set"):
        durable.start("tests.echo", when={1})
    with pytest.raises(durable.WorkflowNotFound):
        durable.start(lambda ctx: None)
    assert WorkflowRun.objects.count() == 0
    assert WorkItem.objects.count() == 0


def test_start_in_a_rolled_back_transaction_leaves_nothing():
    class Abort(Exception):
        pass

    with pytest.raises(Abort):
        with transaction.atomic():
            durable.start("tests.three_steps")
            raise Abort
    assert WorkflowRun.objects.count() == 0
    assert WorkItem.objects.count() == 0
    assert drain() == 0


def test_idempotency_key_returns_the_same_run():
    first = durable.start("tests.three_steps", x=1, idempotency_key="order:42")
    second = durable.start("tests.three_steps", x=2, idempotency_key="order:42")
    other = durable.start("tests.three_steps", x=3, idempotency_key="order:43")
    assert second.pk == first.pk
    assert other.pk != first.pk
    assert WorkflowRun.objects.count() == 2
    assert WorkItem.objects.count() == 2
    assert second.get_input() == {"args": [], "kwargs": {"x": 1}}


@durable.workflow("tests.engine.atomic_fails")
def atomic_fails(ctx):
    def write_then_fail():
        Payment.objects.create(run_id=ctx.run_id, amount=1)
        raise durable.NonRetryableError("card declined")

    try:
        ctx.step("pay", write_then_fail, atomic=True)
    except durable.StepFailed:
        pass
    return Payment.objects.filter(run_id=ctx.run_id).count()


def test_an_atomic_step_that_raises_rolls_back_its_writes():
    run = durable.start(atomic_fails)
    drain()
    run = run_of(run)
    assert run.get_result() == 0
    assert Step.objects.get(run=run, key="pay").status == "failed"


def test_an_atomic_step_commits_its_write_with_its_checkpoint():
    run = durable.start("tests.atomic_pay", amount=7)
    drain()
    assert run_of(run).get_result() == {"amount": 7}
    assert Payment.objects.filter(run_id=run.pk).count() == 1


which_function = {"name": "first"}


def step_one():
    return 1


def step_two():
    return 2


@durable.workflow("tests.engine.changes")
def changes(ctx):
    fn = step_one if which_function["name"] == "first" else step_two
    value = ctx.step("s", fn)
    ctx.step("boom", crashing_step, ctx.run_id, "boom")
    return value


def test_a_step_key_reached_with_another_function_is_a_non_determinism_error():
    run = durable.start(changes)
    crash_at.add("boom")
    which_function["name"] = "first"
    with pytest.raises(SimulatedCrash):
        drain()
    which_function["name"] = "second"  # a deploy changed the code under the running workflow
    try:
        expire_claims()
        workpool.reap(db="default")
        drain()
    finally:
        which_function["name"] = "first"
    run = run_of(run)
    assert run.status == "blocked"  # held for an operator, not failed (test_changed_arguments)
    held = run.waiting_on
    assert held.startswith("a fix of the code: Step 's' was recorded as a step of")
    assert "step_one" in held and "step_two" in held


def test_a_worker_that_lost_its_claim_writes_nothing():
    run = durable.start("tests.three_steps")
    stale = workpool.claim(worker="stale", queues=None, db="default")
    expire_claims()
    workpool.reap(db="default")
    fresh = workpool.claim(worker="fresh", queues=None, db="default")
    assert fresh.run_id == stale.run_id and fresh.token != stale.token
    assert fresh.attempts == 2  # counted at each claim

    record = workpool.StepRecord(
        key="a", seq=1, kind="step", name="x", status="completed", result="1", error=None,
        attempts=1, started_at=dt.datetime.now(dt.timezone.utc), finished_at=dt.datetime.now(dt.timezone.utc),
    )
    with pytest.raises(LeaseLost):
        workpool.record_steps(stale, [record])
    assert not workpool.renew(stale)
    assert not workpool.finish_run(stale, status="completed", result="1", error=None)
    assert not workpool.release(stale, run_status="pending")
    assert Step.objects.filter(run=run).count() == 0
    assert run_of(run).status == "running"

    advance(fresh)
    assert run_of(run).status == "completed"


def test_a_wakeup_during_an_advance_is_not_lost():
    run = durable.start("tests.three_steps")
    claim = workpool.claim(worker="w", queues=None, db="default")
    workpool.wake(run.pk, db="default")  # arrives while the run is being advanced
    assert WorkItem.objects.get(run=run).wake is True
    assert workpool.release(claim, run_status="waiting", waiting_on="something")
    item = WorkItem.objects.get(run=run)
    assert (item.status, item.wake) == ("pending", False)

    again = workpool.claim(worker="w", queues=None, db="default")
    assert workpool.release(again, run_status="waiting", waiting_on="something")
    assert WorkItem.objects.get(run=run).status == "completed"  # idle until the next wakeup
    workpool.wake(run.pk, db="default")
    assert WorkItem.objects.get(run=run).status == "pending"


def test_claims_follow_priority_then_age_and_respect_queues():
    low = durable.start("tests.three_steps", priority=0)
    high = durable.start("tests.three_steps", priority=5)
    other = durable.start("tests.three_steps", queue="reports")
    claim = workpool.claim(worker="w", queues=["default"], db="default")
    assert claim.run_id == high.pk
    claim = workpool.claim(worker="w", queues=["default"], db="default")
    assert claim.run_id == low.pk
    assert workpool.claim(worker="w", queues=["default"], db="default") is None
    assert workpool.claim(worker="w", queues=["reports"], db="default").run_id == other.pk


def test_poison_runs_fail_after_max_deliveries(settings):
    settings.DURABLE_MAX_DELIVERIES = 3
    run = durable.start("tests.three_steps")
    for _ in range(3):
        claim = workpool.claim(worker="doomed", queues=None, db="default")
        assert claim is not None
        expire_claims()  # the worker died holding it
        workpool.reap(db="default")
    run = run_of(run)
    assert run.status == "failed"
    assert "lost 3 times" in run.get_error()["message"]
    assert WorkItem.objects.get(run=run).status == "failed"
    assert workpool.claim(worker="w", queues=None, db="default") is None


def test_wait_returns_the_result_and_times_out_while_unfinished():
    run = durable.start("tests.three_steps", x=1)
    with pytest.raises(durable.WaitTimeout):
        durable.wait(run.pk, timeout=0.05)
    drain()
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]
    assert durable.wait(str(run.pk)) == [1, 2, 3]


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "A" * 10000, "1 OR 1=1", uuid.uuid4()])
def test_wait_for_an_unknown_run(bad_id):
    with pytest.raises(durable.WorkflowNotFound):
        durable.wait(bad_id, timeout=0.1)


def test_wait_inside_a_transaction_is_refused():
    run = durable.start("tests.three_steps")
    with transaction.atomic(), pytest.raises(RuntimeError, match="inside transaction.atomic"):
        durable.wait(run.pk, timeout=1)


def test_the_example_workflow_charges_once_in_one_transaction():
    from example_project.orders.models import Order, Payment as ShopPayment
    from example_project.orders.workflows import create_demo_order

    order = create_demo_order("Ada", "12.50")
    run = durable.start("orders.fulfil", order_id=order.pk)
    drain()
    result = durable.wait(run.pk, timeout=1)
    assert result["paid"] == order.total
    assert result["tracking"].startswith("TRACK-PARCEL-")
    assert ShopPayment.objects.filter(order=order).count() == 1
    assert Order.objects.get(pk=order.pk).status == "shipped"


@pytest.mark.postgres
def test_workers_prepare_their_statements_and_survive_losing_them(settings, monkeypatch):
    """A pooler in transaction mode loses prepared statements; the worker goes on unprepared."""
    from django.db import connection

    from django_durable.workpool import statements

    monkeypatch.setattr(statements, "_prepare", True)
    settings.DEBUG = False
    for _ in range(3):
        durable.start("tests.trivial", n=3)
    drain()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] >= 2
    # What a transaction-mode pooler does behind our back: the session loses the statements
    # without psycopg seeing a DEALLOCATE go by.
    connection.connection.pgconn.exec_(b"DEALLOCATE ALL")
    runs = [durable.start("tests.trivial", n=3) for _ in range(3)]
    drain()
    assert statements._prepare is False
    assert [durable.wait(run.pk, timeout=1) for run in runs] == [3, 3, 3]


@durable.workflow("tests.engine.duplicate_key")
def duplicate_key(ctx):
    for item in ["a", "b"]:
        ctx.step("same", str.upper, item)


def test_a_step_key_used_twice_in_one_run_fails_the_run_clearly():
    run = durable.start(duplicate_key)
    drain()
    run = run_of(run)
    assert run.status == "failed"
    assert "The key 'same' is used twice in this run, by ctx.step() of str.upper and then by ctx.step()" in \
        run.get_error()["message"]
    assert "'same'" in durable.describe(duplicate_key)["problems"][0]  # found before the run, too


@durable.workflow("tests.engine.huge_error")
def huge_error(ctx):
    def explode():
        raise durable.NonRetryableError("x" * 1_000_000)

    ctx.step("explode", explode)


def test_huge_error_messages_are_truncated():
    run = durable.start(huge_error)
    drain()
    step = Step.objects.get(run_id=run.pk, key="explode")
    assert step.status == "failed"
    assert len(step.error) < 100_000
    assert "characters cut" in step.error


@pytest.mark.postgres
def test_finishing_a_run_claims_the_next_in_the_same_statement():
    from django.db import connection

    runs = [durable.start("tests.trivial", n=1) for _ in range(5)]
    with CaptureQueriesContext(connection) as captured:
        assert drain() == 5
    assert [durable.wait(run.pk, timeout=1) for run in runs] == [0] * 5
    statements = [q["sql"] for q in captured.captured_queries if not q["sql"].startswith(("BEGIN", "COMMIT"))]
    # A claim, five finishes that each claim the next run (the fifth finds none), and the claim
    # that finds the queue empty.
    claims_alone = [sql for sql in statements if sql.lstrip().startswith("WITH") and "fence" not in sql]
    finishes = [sql for sql in statements if "done AS" in sql]
    assert len(claims_alone) == 2 and len(finishes) == 5
    assert all("claimed AS" in sql for sql in finishes)
