"""Failures with real worker processes: back-off across restarts, stuck steps, poison, database faults."""

import signal
import time

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Step, Timer, WorkflowEvent, WorkflowRun, WorkItem
from tests.conftest import assert_settled, ledger_counts, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


def test_a_restart_during_a_backoff_loses_nothing(start_worker):
    run = durable.start("tests.retry_after_backoff", backoff=2.0)
    first = start_worker(burst=False)
    wait_for(lambda: Step.objects.filter(run=run, status="retrying").exists(), message="the first attempt to fail")
    first.kill()  # during the back-off
    timer = Timer.objects.get(run=run, kind="retry")
    assert timer.status == "pending"
    second = start_worker(burst=False)
    assert durable.wait(run.pk, timeout=30) == "ok"
    second.signal(signal.SIGTERM)
    assert second.wait() == 0, second.log()
    assert ledger_counts(run.pk) == {"call": 2}
    assert Timer.objects.get(pk=timer.pk).status == "fired"
    # The retry waited out its back-off: the attempt ran no earlier than the timer said.
    step = Step.objects.get(run=run, key="call")
    assert step.attempts == 2 and step.started_at >= timer.fire_at
    assert_settled()


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_step_that_ignores_its_timeout_is_killed_and_its_worker_replaced(start_worker, concurrency):
    stuck = durable.start("tests.stuck_step")
    worker = start_worker(concurrency=concurrency, env={"DURABLE_STEP_KILL_GRACE_SECONDS": "1"})
    wait_for(lambda: ledger_counts(stuck.pk).get("stuck") == 1, message="the stuck step to start")
    started = time.monotonic()
    after = durable.start("tests.three_steps", x=1)  # the replacement must serve this
    assert worker.wait(60) == 0, worker.log()
    assert time.monotonic() - started < 30
    assert durable.wait(stuck.pk, timeout=1) == "django_durable.exceptions.StepTimeout"
    assert durable.wait(after.pk, timeout=1) == [1, 2, 3]
    assert ledger_counts(stuck.pk) == {"stuck": 1}  # judged by its stored deadline, not run again
    assert "replacing worker process" in worker.log()
    assert_settled()


def test_after_a_crash_a_step_past_its_deadline_times_out_instead_of_running_again(start_worker, tmp_path):
    reached, release = tmp_path / "reached", tmp_path / "release"
    run = durable.start("tests.timed_block", str(reached), str(release))
    first = start_worker(burst=False)
    wait_for(reached.exists, message="step b to start")
    first.kill()
    deadline = Step.objects.get(run=run, key="b").deadline_at
    assert deadline is not None  # stored before the step started
    time.sleep(1.2)  # past the deadline
    second = start_worker()
    assert second.wait() == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == "django_durable.exceptions.StepTimeout"
    assert ledger_counts(run.pk) == {"b": 1}


def test_poison_work_fails_after_its_deliveries_while_other_runs_flow(start_worker):
    """RELIABILITY T31."""
    poison = durable.start("tests.poison")
    healthy = [durable.start("tests.three_steps", x=i) for i in range(50)]
    worker = start_worker(concurrency=2, env={"DURABLE_MAX_DELIVERIES": "3"})
    assert worker.wait(120) == 0, worker.log()
    poison = run_of(poison)
    assert poison.status == "failed"
    message = poison.get_error()["message"]
    assert "lost 3 times" in message and "on step 'boom'" in message
    assert ledger_counts(poison.pk) == {"before": 1, "boom": 3}
    assert WorkflowRun.objects.filter(pk__in=[r.pk for r in healthy], status="completed").count() == 50
    assert WorkItem.objects.get(run=poison).status == "failed"


# -- database faults (PostgreSQL) ---------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["after_claim_commit", "before_checkpoint_commit", "after_heartbeat"])
def test_a_killed_connection_is_survived(start_worker, tmp_path, point):
    """RELIABILITY T15: pg_terminate_backend at a point; the worker reconnects and finishes."""
    runs = [durable.start("tests.sleep_in_b", 1.0) for _ in range(3)]
    worker = start_worker(faults=f"{point}=once:{tmp_path / 'once'}+terminate")
    assert worker.wait(60) == 0, worker.log()
    assert (tmp_path / "once").exists()  # the fault fired
    assert [durable.wait(run.pk, timeout=1) for run in runs] == ["done"] * 3
    for run in runs:
        assert Step.objects.filter(run=run).count() == 3
    assert_settled()


@pytest.mark.parametrize("last", [False, True])
def test_an_error_after_a_commit_is_resolved_by_reading_back(start_worker, tmp_path, last):
    """RELIABILITY T16: the checkpoint (or the outcome) committed, then the driver raised."""
    key = "c" if last else "b"
    run = durable.start("tests.three_steps", x=1)
    worker = start_worker(faults=f"after_checkpoint_commit=once:{tmp_path / 'once'}+raise@{key}")
    assert worker.wait(60) == 0, worker.log()
    assert (tmp_path / "once").exists()
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}  # nothing ran twice
    if not last:
        # Read back in place: the worker went on without handing the run back.
        assert "a checkpoint committed although its answer was lost" in worker.log()
        assert "released" not in worker.log()
    assert_settled()


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_claim_whose_answer_was_lost_is_given_back_not_taken_as_a_lost_workers(start_worker, tmp_path,
                                                                                   concurrency):
    """The claim committed, then its answer was lost (a primary that died after its commit reached
    the standby): the worker does not know it holds the item, so it gives the item back by its
    token once the database answers, as never claimed. No reaper takes it as a lost worker's, and
    no delivery is counted (with it left to its lease: 'delivery 2 of 5 after worker ... was lost')."""
    runs = [durable.start("tests.three_steps", x=n) for n in range(3)]
    worker = start_worker(faults=f"after_claim_commit=once:{tmp_path / 'once'}+raise", concurrency=concurrency)
    assert worker.wait(60) == 0, worker.log()
    assert (tmp_path / "once").exists()  # the fault fired
    assert [durable.wait(run.pk, timeout=1) for run in runs] == [[n, n + 1, n + 2] for n in range(3)]
    assert "gave back 1 item(s) it had claimed by a statement whose answer was lost" in worker.log(), worker.log()
    assert "after worker" not in worker.log(), worker.log()  # no reaper's "delivery 2 of 5 after worker ... was lost"
    assert not WorkflowEvent.objects.filter(type=WorkflowEvent.Type.WORKER_LOST).exists()
    assert_settled()


@pytest.mark.postgres
def test_a_read_only_database_pauses_work_without_failing_runs(start_worker):
    """RELIABILITY T19: a failover to a read-only server, then back."""
    database = connection.settings_dict["NAME"]
    worker = start_worker(burst=False)
    wait_for(lambda: "started (queues" in worker.log(), message="the worker to start")
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    try:
        runs = [durable.start("tests.three_steps", x=i) for i in range(5)]  # this session may write
        time.sleep(2.0)
        assert WorkflowRun.objects.filter(status__in=["failed", "completed"]).count() == 0
        assert worker.running()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
    for run in runs:
        assert durable.wait(run.pk, timeout=30) == [run.get_input()["kwargs"]["x"] + i for i in range(3)]
    assert "read-only" in worker.log()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0


@pytest.mark.postgres
@pytest.mark.parametrize("point", ["after_claim_commit", "before_checkpoint_commit", "sweeper_after_select"])
@pytest.mark.parametrize("sqlstate", ["40001", "40P01"])
def test_serialization_failures_and_deadlocks_are_retried(start_worker, tmp_path, point, sqlstate):
    """RELIABILITY T20: the worker's own statement fails with 40001 or 40P01."""
    runs = [durable.start("tests.three_steps", x=i) for i in range(3)]
    if point == "sweeper_after_select":
        # Something for the reaper to find: a claim whose worker is gone.
        WorkItem.objects.filter(run=runs[0]).update(
            status="processing", claim_token="00000000-0000-0000-0000-000000000001",
            claim_expires_at="2000-01-01T00:00:00Z", attempts=1,
        )
    worker = start_worker(faults=f"{point}=once:{tmp_path / 'once'}+sqlstate:{sqlstate}")
    assert worker.wait(60) == 0, worker.log()
    assert (tmp_path / "once").exists()
    assert [durable.wait(run.pk, timeout=1) for run in runs] == [[i, i + 1, i + 2] for i in range(3)]
    assert not WorkItem.objects.exists()  # each run's end deleted its item, none left to deliver again
    assert_settled()
