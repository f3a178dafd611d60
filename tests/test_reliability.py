"""Tests of ../shared/RELIABILITY.md that had no home of their own: crash and recovery (T03, T05,
T06), claiming under contention (T09, T11), transactional start (T13), clock skew (T22), load
(T28, T29) and bad data (T33, T34). docs/reliability.md maps every T01-T40 to its test.
"""

import collections
import datetime as dt
import signal
import threading
import time
import uuid

import pytest
from django.db import IntegrityError, connection, transaction

import django_durable as durable
from django_durable import workpool
from django_durable.models import Step, WorkflowRun, WorkItem
from django_durable.testing import drain
from tests.conftest import assert_settled, ledger_counts, replay_again, wait_for
from tests.harness.workers import in_threads
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


# -- A. crash and recovery ----------------------------------------------------------------------------------


def test_t03_killed_before_the_terminal_commit(start_worker):
    """RELIABILITY T03: recovery replays the recorded steps from memo and writes the outcome once.

    The last step's checkpoint commits with the outcome (docs/decisions.md), so that one step
    runs again, as after any crash before its checkpoint; the earlier ones do not.
    """
    run = durable.start("tests.three_steps", x=1)
    first = start_worker(faults="before_terminal_commit=kill")
    assert first.wait() == -signal.SIGKILL
    assert run_of(run).status == "running" and ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}
    second = start_worker()
    assert second.wait() == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]  # the same result
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 2}
    assert (first.log() + second.log()).count(f"Run {run.pk} of tests.three_steps completed") == 1
    assert_settled()


def test_t05_a_worker_restarted_under_the_same_name_does_not_keep_the_dead_ones_claim(start_worker, tmp_path):
    """RELIABILITY T05: liveness is per claim token, not per worker name."""
    reached, release = tmp_path / "reached", tmp_path / "release"
    run = durable.start("tests.block_in_b", str(reached), str(release))
    first = start_worker("--name", "web-1", burst=False)
    wait_for(reached.exists, message="step b to start")
    first.kill()
    second = start_worker("--name", "web-1", burst=False)  # the same host and name, restarted
    assert durable.wait(run.pk, timeout=60) == "done"
    assert f"Run {run.pk}: delivery 2 of 5 after worker web-1 was lost." in second.log()  # by its lease, not masked
    assert ledger_counts(run.pk) == {"a": 1, "b": 2, "c": 1}
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.log()
    assert_settled()


def test_t06_a_live_worker_recovers_a_dead_ones_work_with_no_restart(start_worker, tmp_path):
    """RELIABILITY T06: B's reaper recovers A's run after A's lease, and survives its own error."""
    reached, release = tmp_path / "reached", tmp_path / "release"
    run = durable.start("tests.block_in_b", str(reached), str(release))
    a = start_worker("--name", "a", burst=False)
    wait_for(reached.exists, message="step b to start in A")
    b = start_worker("--name", "b", burst=False, faults=f"sweeper_after_select=once:{tmp_path / 'swept'}+raise")
    a.kill()  # and nothing is ever restarted
    assert durable.wait(run.pk, timeout=60) == "done"
    assert "fault injected at sweeper_after_select" in b.log()  # its first sweep failed...
    assert f"Run {run.pk}: delivery 2 of 5 after worker a was lost." in b.log()  # ...and a later one recovered the run
    assert [pid for run_id, step, pid in ledger.entries() if step == "b"] == [a.pid, b.pid]
    b.signal(signal.SIGTERM)
    assert b.wait() == 0, b.log()
    assert_settled()


# -- B. claiming under contention ---------------------------------------------------------------------------


def _bulk_runs(count: int) -> list[uuid.UUID]:
    """`count` runs of tests.three_steps with their work items, inserted in bulk."""
    from django_durable.models import uuid7

    runs = [WorkflowRun(id=uuid7(), workflow="tests.three_steps", input='{"args": [], "kwargs": {}}')
            for _ in range(count)]
    WorkflowRun.objects.bulk_create(runs, batch_size=2000)
    WorkItem.objects.bulk_create([WorkItem(kind="advance", run_id=r.id) for r in runs], batch_size=2000)
    return [r.id for r in runs]


_threads = in_threads  # (tests/harness/workers.py)


@pytest.mark.postgres
@pytest.mark.timeout(600)
def test_t09_eight_claimers_take_ten_thousand_items_once_each_through_the_partial_index():
    """RELIABILITY T09 (claims take one item each, not a batch): every row claimed exactly once,
    rows updated == rows returned, and the claim's plan reads the partial index of pending rows."""
    from django_durable.workpool import postgres

    ids = set(_bulk_runs(10_000))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_work_item")
        with transaction.atomic():
            sql, params = postgres._pick(None, "default")
            cursor.execute(f"EXPLAIN {sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "durable_work_item_ready" in plan, plan
    claimed: list[list] = [[] for _ in range(8)]

    def claimer(index):
        while True:
            claim = workpool.claim(worker=f"c{index}", queues=None, db="default")
            if claim is None:
                return
            claimed[index].append(claim.run_id)

    assert _threads(claimer, 8) == []
    every = [run_id for mine in claimed for run_id in mine]
    assert len(every) == len(set(every)) == 10_000 and set(every) == ids
    assert sum(1 for mine in claimed if mine) >= 2  # they really competed
    assert set(WorkItem.objects.values_list("attempts", flat=True)) == {1}
    assert WorkItem.objects.filter(status="processing").count() == 10_000


@pytest.mark.postgres
def test_t11_concurrent_reapers_move_each_expired_claim_once_and_leave_live_ones_alone():
    """RELIABILITY T11: 100 expired claims; three reapers and two live claimers at once."""
    ids = _bulk_runs(100)
    while workpool.claim(worker="dead", queues=None, db="default") is not None:
        pass
    WorkItem.objects.update(claim_expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc))
    reaped, live = [0, 0, 0], [[], []]
    stop = threading.Event()

    def reaper(index):
        while not stop.is_set():
            reaped[index] += workpool.reap(db="default", batch=10)

    def claimer(index):
        while not stop.is_set():
            claim = workpool.claim(worker=f"live{index}", queues=None, db="default")
            if claim is not None:
                live[index].append(claim.item_id)

    def both(index):
        reaper(index) if index < 3 else claimer(index - 3)

    timer = threading.Timer(3.0, stop.set)
    timer.start()
    assert _threads(both, 5) == []
    timer.cancel()
    assert sum(reaped) == 100  # each expired claim moved once, by one reaper
    items = {item.id: item for item in WorkItem.objects.filter(run_id__in=ids)}
    taken = [item_id for mine in live for item_id in mine]
    assert len(taken) == len(set(taken))
    for item in items.values():
        if item.id in taken:  # re-claimed by a live claimer, and never reaped from it
            assert (item.status, item.attempts) == ("processing", 2) and item.claimed_by.startswith("live")
        else:
            assert (item.status, item.attempts) == ("pending", 1)


# -- transactional start ---------------------------------------------------------------------------------------


def test_t13_a_run_started_in_an_open_transaction_is_invisible_to_workers_until_commit():
    """RELIABILITY T13, the committed case (the rolled-back one: test_engine)."""
    started, commit = threading.Event(), threading.Event()
    made = []

    def web_request(_):
        with transaction.atomic():
            made.append(durable.start("tests.three_steps", x=1))
            started.set()
            assert commit.wait(30)

    thread = threading.Thread(target=_threads, args=(web_request, 1))
    thread.start()
    assert started.wait(30)
    assert workpool.claim(worker="w", queues=None, db="default") is None  # not committed: not there
    commit.set()
    thread.join(timeout=60)
    assert drain() >= 1
    assert durable.wait(made[0].pk, timeout=1) == [1, 2, 3]


# -- D. time ---------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("skew", ["600", "-600", "0@1.5:-600"], ids=["ahead", "behind", "jumps-back"])
def test_t22_a_worker_with_a_wrong_clock_expires_no_lease_and_fires_no_timer_early(start_worker, tmp_path, skew):
    """RELIABILITY T22: the worker's wall clock 10 minutes ahead, behind, or jumping back mid-run."""
    reached = tmp_path / "reached"
    sleep = durable.start("tests.measured_sleep", 1.0)
    backoff = durable.start("tests.measured_backoff", 0.5)
    long = durable.start("tests.sleep_in_b", 3, str(reached))  # a 3 s step under a 2 s lease
    delayed = durable.start("tests.three_steps", x=1, delay=2)
    worker = start_worker(burst=False, env={"DURABLE_TEST_CLOCK_SKEW": skew})
    before, after = durable.wait(sleep.pk, timeout=60)
    assert (after - before).total_seconds() >= 1.0
    assert durable.wait(backoff.pk, timeout=60) == "ok"
    attempts = sorted(float(s.split("@")[1]) for r, s, _ in ledger.entries() if r == str(backoff.pk))
    assert attempts[1] - attempts[0] >= 0.5
    assert durable.wait(long.pk, timeout=60) == "done"
    assert ledger_counts(long.pk) == {"a": 1, "b": 1, "c": 1}  # its lease was never taken for expired
    assert durable.wait(delayed.pk, timeout=60) == [1, 2, 3]
    first = Step.objects.filter(run=delayed).order_by("seq").first()
    assert first.started_at >= run_of(delayed).scheduled_at  # the delayed start was not early
    log = worker.log()
    assert "lost its claim" not in log and "expired claim" not in log, log
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, log
    assert_settled()


# -- F. load ---------------------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_t28_ten_thousand_queued_runs_complete_exactly_once_on_four_workers(start_worker):
    """RELIABILITY T28 (the speed figures are bench/'s: `make bench`)."""
    ids = set(_bulk_runs(10_000))
    worker = start_worker(concurrency=4)
    assert worker.wait(720) == 0, worker.log()[-5000:]
    assert WorkflowRun.objects.filter(status="completed").count() == 10_000
    executions = ledger.entries()
    assert len(executions) == 30_000
    assert len({(run_id, step) for run_id, step, _ in executions}) == 30_000  # none ran twice
    assert {uuid.UUID(run_id) for run_id, _, _ in executions} == ids
    assert len({pid for _, _, pid in executions}) == 4  # all four shared the work
    assert Step.objects.count() == 30_000
    assert_settled()


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_t29_a_backlog_of_failing_runs_starves_nothing(start_worker):
    """RELIABILITY T29: 500 runs failing for ever, queued first, then 5,000 fresh ones. The fresh
    ones all run; a failing run is claimed only when its back-off has passed."""
    backoff = 5.0
    failing = [durable.start("tests.always_failing", backoff) for _ in range(500)]
    fresh = [durable.start("tests.tick") for _ in range(5000)]
    began = time.monotonic()
    worker = start_worker(concurrency=2, burst=False)
    wait_for(lambda: WorkflowRun.objects.filter(workflow="tests.tick", status="completed").count() == 5000,
             timeout=600, interval=0.5, message="the fresh runs to complete")
    elapsed = time.monotonic() - began
    fails = collections.Counter(run_id for run_id, step, _ in ledger.entries() if step == "fail")
    attempts = [fails[str(run.pk)] for run in failing]  # made while the fresh ones ran
    assert max(attempts) <= elapsed / backoff + 1, (max(attempts), elapsed)  # never before its back-off passed
    assert min(attempts) >= 1  # and not starved either
    assert {run.status for run in WorkflowRun.objects.filter(pk__in=[r.pk for r in failing])} <= {"waiting", "running",
                                                                                                   "pending"}
    for run in failing:
        durable.cancel(run.pk)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.log()[-5000:]
    assert WorkflowRun.objects.filter(pk__in=[r.pk for r in fresh], status="completed").count() == 5000


# -- G. bad data -----------------------------------------------------------------------------------------


class Opaque:
    pass


def _gen():
    yield 1


@pytest.mark.parametrize("value, named", [
    ({1, 2}, "builtins.set"), (b"raw", "builtins.bytes"), (Opaque(), "Opaque"), (_gen(), "builtins.generator"),
    (float("nan"), "nan"),
])
def test_t33_values_that_are_not_json_are_refused_before_anything_is_stored(value, named):
    """RELIABILITY T33: start and signal refuse them naming the type; nothing is written."""
    with pytest.raises(durable.NotSerializable, match=named):  # a TypeError
        durable.start("tests.three_steps", x=value)
    assert WorkflowRun.objects.count() == 0 and WorkItem.objects.count() == 0
    run = durable.start("tests.approval")
    with pytest.raises(durable.NotSerializable, match=named):
        durable.signal(run.pk, "approved", value)
    assert not run.signals.exists()


@durable.workflow("tests.reliability.returns_a_set")
def returns_a_set(ctx):
    return ctx.step("bad", lambda: {1, 2})


def test_t33_a_step_returning_something_that_is_not_json_fails_without_retry_or_pickle():
    run = durable.start(returns_a_set)
    drain()
    step = Step.objects.get(run=run, key="bad")
    assert (step.status, step.attempts) == ("failed", 1)  # not retried: it would fail the same way
    assert step.result is None and "builtins.set" in step.error
    assert run_of(run).status == "failed"


def _raw_run(workflow="tests.three_steps", input='{"args": [], "kwargs": {}}'):
    from django_durable.models import uuid7

    run = WorkflowRun.objects.create(id=uuid7(), workflow=workflow, input=input)
    WorkItem.objects.create(kind="advance", run=run)
    return run


def test_t34_a_row_with_unreadable_input_fails_with_an_error():
    """RELIABILITY T34: rows written by hand. Each ends failed, with an error, and nothing loops."""
    run = _raw_run(input="{not json")
    assert drain() == 1
    run = run_of(run)
    assert run.status == "failed" and "stored input cannot be read" in run.get_error()["message"]


def test_t34_an_unknown_workflow_name_fails_after_the_grace(settings):
    settings.DURABLE_MISSING_CODE_GRACE_SECONDS = 0
    run = _raw_run(workflow="nobody.registered.this")
    drain()
    run = run_of(run)
    assert run.status == "failed" and "'nobody.registered.this'" in run.get_error()["message"]


def test_t34_a_negative_attempt_is_refused_by_the_schema():
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            WorkflowRun.objects.create(workflow="tests.three_steps", attempt=-1)


def test_t34_a_claimed_item_without_a_lease_is_reaped():
    run = durable.start("tests.three_steps", x=1)
    claim = workpool.claim(worker="ghost", queues=None, db="default")
    WorkItem.objects.filter(pk=claim.item_id).update(claim_expires_at=None)  # "running" with no lease
    assert workpool.reap(db="default") == 1
    drain()
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]


def test_t34_a_damaged_journal_entry_fails_the_run_instead_of_feeding_the_workflow():
    run = durable.start("tests.three_steps", x=1)
    drain()
    Step.objects.filter(run=run, key="b").update(result="{damaged")
    replay_again(run.pk)
    drain()
    run = run_of(run)
    assert run.status == "failed", run.get_error()
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}  # nothing ran again on damaged data


@pytest.mark.postgres
def test_t34_a_step_number_out_of_range_fails_the_run_and_the_worker_goes_on(start_worker):
    """The database refuses the engine's write (integer out of range): the run fails saying so,
    rather than being handed back for ever."""
    run = durable.start("tests.three_steps", x=1)
    Step.objects.create(run=run, key="z", seq=2**31 - 1, kind="note", name="now", status="completed", result="1")
    worker = start_worker(burst=False)
    with pytest.raises(durable.WorkflowFailed, match="database refused"):
        durable.wait(run.pk, timeout=30)
    later = durable.start("tests.three_steps", x=2)
    assert durable.wait(later.pk, timeout=30) == [2, 3, 4]
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
