"""Real `manage.py durable_worker` processes: completion, crashes, pauses, shutdown, many workers."""

import signal
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, connections

import django_durable as durable
from django_durable.models import Step, Worker, WorkflowEvent, WorkflowRun, WorkItem
from tests.conftest import assert_settled, ledger_counts, wait_for
from tests.testapp import ledger
from tests.testapp.models import Payment

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


def test_a_three_step_workflow_runs_once_through_a_worker_process(start_worker):
    run = durable.start("tests.three_steps", x=1)
    worker = start_worker()
    assert worker.wait() == 0, worker.log()
    assert run_of(run).status == "completed"
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}
    log = worker.log()
    assert f"Run {run.pk} of tests.three_steps started" in log
    assert f"Run {run.pk} of tests.three_steps completed" in log
    assert_settled()


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_worker_process_runs_with_what_its_start_up_made_frozen(start_worker, concurrency):
    """What start-up made is frozen out of the collector's sight before the worker loop (and before
    the supervisor forks): the drain's collections do not walk it again. Until then the collector
    is held off, from django-durable's import on (no collection while Django loads the project),
    and it is on again when the steps run."""
    runs = [durable.start("tests.process_state") for _ in range(concurrency)]
    worker = start_worker(concurrency=concurrency, env={"DURABLE_TEST_COUNT_COLLECTIONS": "1"})
    assert worker.wait() == 0, worker.log()
    for run in runs:
        state = durable.wait(run.pk, timeout=1)
        assert state["frozen"] > 10_000, state  # Django, the project, the workflows
        assert state["collecting"] and state["start_collections"] == 0, state


def test_sigkill_mid_step_then_a_fresh_worker_finishes_the_run(start_worker, tmp_path):
    """RELIABILITY T01: step 1 once, step 2 twice (it was running), step 3 once."""
    reached, release = tmp_path / "reached", tmp_path / "release"
    run = durable.start("tests.block_in_b", str(reached), str(release))
    first = start_worker(burst=False)
    wait_for(reached.exists, message="step b to start")
    first.kill()
    assert ledger_counts(run.pk) == {"a": 1, "b": 1}
    assert WorkItem.objects.get(run=run).status == "processing"  # until its lease expires

    second = start_worker()
    assert second.wait() == 0, second.log()
    run = run_of(run)
    assert run.status == "completed" and run.get_result() == "done"
    assert ledger_counts(run.pk) == {"a": 1, "b": 2, "c": 1}
    assert list(Step.objects.filter(run=run).values_list("key", flat=True).order_by("seq")) == ["a", "b", "c"]
    assert_settled()


@pytest.mark.parametrize(
    "fault, runs_of_b",
    [
        ("after_step_return=kill@b", 2),  # the step ran, nothing recorded: it runs again
        ("before_checkpoint_commit=kill@b", 2),
        ("after_checkpoint_commit=kill@b", 1),  # recorded: never runs again (T02)
    ],
)
def test_killed_around_a_checkpoint(start_worker, fault, runs_of_b):
    run = durable.start("tests.three_steps", x=1)
    first = start_worker(faults=fault)
    assert first.wait() == -signal.SIGKILL
    second = start_worker()
    assert second.wait() == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == [1, 2, 3]
    assert ledger_counts(run.pk) == {"a": 1, "b": runs_of_b, "c": 1}
    assert Step.objects.filter(run=run, key="b").count() == 1
    assert_settled()


def test_killed_before_the_commit_an_atomic_step_leaves_neither_write_nor_checkpoint(start_worker):
    run = durable.start("tests.atomic_pay", amount=10)
    first = start_worker(faults="before_checkpoint_commit=kill@pay")
    assert first.wait() == -signal.SIGKILL
    assert ledger_counts(run.pk) == {"pay": 1}  # the step ran and wrote, but did not commit
    assert Payment.objects.filter(run_id=run.pk).count() == 0
    assert not Step.objects.filter(run=run, key="pay").exists()

    second = start_worker()
    assert second.wait() == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == {"amount": 10}
    assert ledger_counts(run.pk) == {"pay": 2, "after": 1}
    assert Payment.objects.filter(run_id=run.pk).count() == 1
    assert_settled()


def snapshot():
    """Everything a worker could have written, to compare before and after."""
    return (
        list(WorkflowRun.objects.order_by("id").values_list("id", "status", "result", "error", "updated_at", "finished_at")),
        list(Step.objects.order_by("id").values_list("id", "run_id", "key", "status", "result", "finished_at")),
        list(WorkItem.objects.order_by("id").values_list("id", "status", "claim_token", "claimed_by", "attempts", "claim_expires_at")),
    )


@pytest.mark.parametrize("pause", ["mid-step", "between steps"])
def test_a_paused_worker_changes_nothing_after_its_run_was_taken_over(start_worker, tmp_path, pause):
    """RELIABILITY T10: SIGSTOP until the lease expires; another worker takes over; SIGCONT.

    Paused mid-step, the resumed worker's checkpoint is fenced out; paused right after a
    checkpoint, it must not start the next step at all.
    """
    reached = tmp_path / "reached"
    if pause == "mid-step":
        run = durable.start("tests.sleep_in_b", 3, str(reached))
        paused = start_worker("--name", "paused", burst=False)
    else:
        run = durable.start("tests.three_steps", x=1)
        paused = start_worker(
            "--name", "paused", burst=False, faults=f"after_checkpoint_commit=touch:{reached}+sleep:1@b"
        )
    wait_for(reached.exists, message="the worker to reach the pause point")
    wait_for(lambda: Worker.objects.filter(name="paused").exists(), message="the worker's first report")
    paused.freeze()  # outside any transaction: frozen inside one, it would hold its locks throughout
    try:
        taker = start_worker("--name", "taker")
        assert taker.wait() == 0, taker.log()
        assert run_of(run).status == "completed"
        before = snapshot()
    finally:
        paused.signal(signal.SIGCONT)
    wait_for(lambda: "lost its claim" in paused.log(), timeout=15, message="the resumed worker to notice")
    time.sleep(1.0)  # let it try whatever it would try
    assert snapshot() == before
    by_paused = [step for run_id, step, pid in ledger.entries() if pid == paused.pid]
    assert by_paused == ["a", "b"]  # it started no step after it resumed
    assert ledger_counts(run.pk) == ({"a": 1, "b": 2, "c": 1} if pause == "mid-step" else {"a": 1, "b": 1, "c": 1})
    assert paused.running()  # it abandoned the run, not its job
    assert_settled()


def test_sigterm_lets_the_step_finish_then_hands_the_run_back(start_worker, tmp_path):
    """RELIABILITY T04: no new step after SIGTERM; the run is released, not left claimed."""
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 1.5, str(reached))
    worker = start_worker(burst=False)
    wait_for(reached.exists, message="step b to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
    assert ledger_counts(run.pk) == {"a": 1, "b": 1}  # b finished; c never started
    item = WorkItem.objects.get(run=run)
    assert (item.status, item.claim_token, item.claimed_by) == ("pending", None, "")
    assert run_of(run).status == "pending"

    second = start_worker()
    assert second.wait() == 0, second.log()
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}
    assert_settled()


def test_sigterm_past_the_grace_releases_the_run_for_another_worker_at_once(start_worker, tmp_path):
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 30, str(reached))
    long_lease = {"DURABLE_LEASE_SECONDS": "60", "DURABLE_HEARTBEAT_SECONDS": "5"}
    worker = start_worker("--grace", "0.3", burst=False, env=long_lease)
    wait_for(reached.exists, message="step b to start")
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0, worker.log()
    assert time.monotonic() - started < 10
    item = WorkItem.objects.get(run=run)
    assert (item.status, item.claim_token) == ("pending", None)

    second = start_worker(env=long_lease)  # with a 60 s lease, only a release lets it in now
    assert second.wait(30) == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == "done"
    assert_settled()


@pytest.mark.postgres  # (about 27 s of waiting: once, on the PostgreSQL run)
def test_the_supervisor_kills_a_worker_process_that_does_not_stop_in_time(start_worker, tmp_path):
    """A worker process whose maintenance thread hangs (as in a call to a database that does not
    answer) cannot hand its step back: the supervisor ends it once the bound has passed, and the
    run goes on elsewhere after its lease."""
    from django_durable.worker.process import ABANDON_SECONDS
    from django_durable.workpool.listening import DEAD_PEER_SECONDS

    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 90, str(reached))
    supervisor = start_worker("--grace", "0.5", concurrency=2, burst=False,
                              faults=f"after_heartbeat=block:{tmp_path / 'never'}")
    wait_for(reached.exists, message="step b to start")
    claimed = WorkItem.objects.get(run=run).claim_expires_at
    # The first renewal of the lease is the heartbeat the fault blocks for good.
    wait_for(lambda: WorkItem.objects.get(run=run).claim_expires_at != claimed, message="a heartbeat")
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(0.5 + DEAD_PEER_SECONDS + ABANDON_SECONDS + 30) == 0, supervisor.log()
    bound = 0.5 + DEAD_PEER_SECONDS + ABANDON_SECONDS
    assert f"did not stop within {bound:g} s of the stop request; killed it." in supervisor.log()
    assert "Took back" not in supervisor.log()  # (not buried: the database may be the trouble)

    second = start_worker()
    assert second.wait(60) == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == "done"
    assert ledger_counts(run.pk) == {"a": 1, "b": 2, "c": 1}


def test_a_second_sigterm_exits_at_once(start_worker, tmp_path):
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 30, str(reached))
    worker = start_worker("--grace", "60", burst=False)
    wait_for(reached.exists, message="step b to start")
    worker.signal(signal.SIGTERM)
    # The second signal only once the first is seen taken: two sent while the first still waits
    # for the worker to be scheduled (a busy machine) are one signal, and the worker rightly waits
    # for the step then.
    wait_for(lambda: "is stopping" in worker.log(), message="the worker to say it is stopping")
    assert f"it lets the step of run {run.pk} finish, for up to 60 s more; a second SIGTERM" in worker.log()
    started = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0, worker.log()
    assert time.monotonic() - started < 5
    assert WorkItem.objects.get(run=run).status == "pending"


def test_stop_signals_and_step_alarms_go_to_the_main_thread_alone(start_worker, tmp_path):
    """The worker's own threads block SIGTERM, SIGINT and SIGALRM: the kernel gives a signal sent to
    the process to a thread that does not block it, and one taken by the maintenance thread would
    leave the main thread asleep in a step until the step ended, the stop request or the step's
    timeout unheard meanwhile."""
    reached = tmp_path / "reached"
    durable.start("tests.sleep_in_b", 30, str(reached))
    worker = start_worker("--grace", "0.5", burst=False)
    wait_for(reached.exists, message="step b to start")
    tasks = Path(f"/proc/{worker.pid}/task")
    if not tasks.exists():
        pytest.skip("needs Linux's /proc")

    main_thread_signals = {signal.SIGTERM, signal.SIGINT, signal.SIGALRM}

    def blocked(tid: int) -> set[int]:
        status = (tasks / str(tid) / "status").read_text()
        mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)
        return {signum for signum in main_thread_signals if mask >> (signum - 1) & 1}

    threads = sorted(int(tid.name) for tid in tasks.iterdir())
    assert worker.pid in threads and len(threads) >= 2, threads  # the main thread and the maintenance thread
    assert blocked(worker.pid) == set()
    for tid in threads:
        if tid != worker.pid:
            assert blocked(tid) == main_thread_signals, tid
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()


def test_concurrent_starts_with_one_idempotency_key_make_one_run():
    """RELIABILITY T12."""
    barrier = threading.Barrier(20)
    ids, errors = [], []

    def start():
        try:
            barrier.wait()
            ids.append(durable.start("tests.three_steps", idempotency_key="order:7").pk)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(ids) == 20 and len(set(ids)) == 1
    assert WorkflowRun.objects.count() == 1
    assert WorkItem.objects.count() == 1


@pytest.mark.postgres
def test_many_runs_across_four_worker_processes(start_worker):
    runs = [durable.start("tests.five_steps") for _ in range(500)]
    worker = start_worker(concurrency=4)
    assert worker.wait(240) == 0, worker.log()
    assert WorkflowRun.objects.filter(status="completed").count() == 500
    assert Step.objects.count() == 2500
    executions = ledger.entries()
    assert len(executions) == 2500
    assert len({(run_id, step) for run_id, step, _ in executions}) == 2500  # none ran twice
    assert {run_id for run_id, _, _ in executions} == {str(run.pk) for run in runs}
    assert len({pid for _, _, pid in executions}) >= 2  # the work was shared
    assert_settled()


@pytest.mark.postgres
def test_no_transaction_is_open_while_step_code_runs(start_worker, tmp_path):
    """RELIABILITY T14: the worker's backends are never idle in transaction during a step."""
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 3, str(reached))
    worker = start_worker()
    wait_for(reached.exists, message="step b to start")
    samples = []
    with connection.cursor() as cursor:
        for _ in range(10):
            cursor.execute(
                "SELECT state, EXTRACT(EPOCH FROM now() - xact_start) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend'"
            )
            samples.extend(cursor.fetchall())
            time.sleep(0.15)
        assert samples, "the worker's connections should be visible"
        # The maintenance thread's short bookkeeping transactions (timers, schedules) can be
        # caught between two statements; a transaction held around the 3 s step would be
        # seen idle and older than a quarter second in nearly every sample.
        assert [s for s in samples if s[0] == "idle in transaction" and s[1] > 0.25] == []
        assert [s for s in samples if s[1] is not None and s[1] > 1.0] == []
        # The run's row is not locked: an update and an insert that references it go through.
        cursor.execute("SET lock_timeout = '1s'")
        cursor.execute("UPDATE durable_workflow_run SET updated_at = now() WHERE id = %s", [run.pk])
        cursor.execute(
            "INSERT INTO durable_timer (kind, run_id, step_key, fire_at, status, created_at) "
            "VALUES ('sleep', %s, 'probe', now(), 'cancelled', now())",
            [run.pk],
        )
        cursor.execute("RESET lock_timeout")
    assert worker.wait() == 0, worker.log()
    assert run_of(run).status == "completed"


@pytest.mark.postgres
def test_notify_wakes_an_idle_worker_at_once(start_worker):
    worker = start_worker(burst=False, env={"DURABLE_POLL_INTERVAL": "30"})
    wait_for(lambda: "started (queues" in worker.log(), message="the worker to start")
    started = time.monotonic()
    run = durable.start("tests.three_steps", x=1)
    assert durable.wait(run.pk, timeout=10) == [1, 2, 3]
    assert time.monotonic() - started < 5  # far below the 30 s poll interval


def test_polling_finds_work_without_notifications(start_worker):
    """What a worker behind a transaction-mode pooler sees: no NOTIFY ever arrives."""
    worker = start_worker(burst=False, env={"DURABLE_POLL_INTERVAL": "0.5", "DURABLE_LISTEN_NOTIFY": "0"})
    wait_for(lambda: "started (queues" in worker.log(), message="the worker to start")
    run = durable.start("tests.three_steps", x=1)
    assert durable.wait(run.pk, timeout=15) == [1, 2, 3]
    assert "LISTEN" not in worker.log()


def test_supervisor_replaces_a_worker_process_that_dies(start_worker, tmp_path):
    import os

    worker = start_worker(concurrency=2, burst=False)
    wait_for(lambda: worker.log().count("started (queues") >= 2, message="two workers")
    children = [int(pid) for pid in os.popen(f"pgrep -P {worker.pid}").read().split()]
    assert len(children) == 2
    os.kill(children[0], signal.SIGKILL)
    wait_for(lambda: worker.log().count("started (queues") >= 3, message="a replacement worker")
    run = durable.start("tests.three_steps", x=1)
    assert durable.wait(run.pk, timeout=15) == [1, 2, 3]
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert os.popen(f"pgrep -P {worker.pid}").read().split() == []



def test_heartbeats_keep_a_step_longer_than_the_lease(start_worker, tmp_path):
    """A 4-second step under a 2-second lease runs once, even with a second worker reaping."""
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 4, str(reached))
    first = start_worker(burst=False)
    wait_for(reached.exists, message="step b to start")
    second = start_worker()
    assert second.wait() == 0, second.log()
    assert durable.wait(run.pk, timeout=10) == "done"
    assert ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1}
    assert "expired" not in first.log() + second.log()


def test_a_worker_serves_only_its_queues(start_worker):
    default = durable.start("tests.three_steps", x=1)
    report = durable.start("tests.three_steps", x=10, queue="reports")
    worker = start_worker("--queues", "reports")
    assert worker.wait() == 0, worker.log()
    assert run_of(report).status == "completed"
    assert run_of(default).status == "pending"
    worker = start_worker("--queues", "default,other")
    assert worker.wait() == 0, worker.log()
    assert durable.wait(default.pk, timeout=1) == [1, 2, 3]


def test_start_and_wait_returns_the_result_from_a_running_worker(start_worker):
    worker = start_worker(burst=False)
    assert durable.start_and_wait("tests.three_steps", x=4, timeout=30) == [4, 5, 6]
    with pytest.raises(durable.WorkflowFailed, match="KeyError"):
        durable.start_and_wait("tests.raises", timeout=30)
    assert worker.running()


def test_sixteen_claimers_racing_for_one_row_get_one_claim():
    """RELIABILITY T08: exactly one winner per round; the others get nothing, not an error."""
    from django_durable import workpool

    rounds = 300 if connection.vendor == "postgresql" else 100
    claimers = 16
    barrier = threading.Barrier(claimers + 1)
    results: list[list] = [[] for _ in range(rounds)]
    errors = []

    def claimer(index):
        try:
            for round_ in range(rounds):
                barrier.wait()
                claim = workpool.claim(worker=f"c{index}", queues=None, db="default")
                if claim is not None:
                    results[round_].append(claim.run_id)
                barrier.wait()
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    runs = []
    for round_ in range(rounds):
        runs.append(durable.start("tests.three_steps"))
        barrier.wait()  # release the claimers
        barrier.wait()  # they have all tried
    for thread in threads:
        thread.join()
    assert errors == []
    assert all(len(winners) == 1 for winners in results), [len(w) for w in results]
    assert [winners[0] for winners in results] == [run.pk for run in runs]
    assert set(WorkItem.objects.values_list("attempts", flat=True)) == {1}


def test_a_worker_reports_itself_while_it_runs_and_when_it_stops(start_worker):
    from django_durable.models import Worker

    worker = start_worker(burst=False, env={"DURABLE_HEARTBEAT_SECONDS": "1"})
    wait_for(lambda: Worker.objects.filter(stopped_at__isnull=True).exists(), message="the worker's row")
    row = Worker.objects.get()
    assert row.queues == "" and row.host and row.pid > 0
    run = durable.start("tests.three_steps", x=1)
    assert durable.wait(run.pk, timeout=15) == [1, 2, 3]
    wait_for(lambda: Worker.objects.get().processed >= 1, message="the worker to report its count")
    first_seen = Worker.objects.get().last_seen
    wait_for(lambda: Worker.objects.get().last_seen > first_seen, message="a later report")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.log()
    assert Worker.objects.get().stopped_at is not None


def test_a_killed_worker_process_is_shown_stopped_and_its_run_resumes_without_waiting_out_the_lease(
        start_worker, tmp_path):
    """Issue 12: the supervisor takes the dead child's claims back at once, fenced."""
    import os

    from django_durable.models import Worker

    lease = 60.0
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 30, str(reached))
    worker = start_worker(concurrency=2, burst=False, env={"DURABLE_LEASE_SECONDS": str(lease)})
    wait_for(reached.exists, message="step b to start")
    item = WorkItem.objects.get(run=run)
    name = item.claimed_by
    pid = int(name.rpartition(":")[2])
    assert pid in [int(p) for p in os.popen(f"pgrep -P {worker.pid}").read().split()]
    wait_for(lambda: Worker.objects.filter(name=name, stopped_at__isnull=True).exists(), message="its row")
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    assert durable.wait(run.pk, timeout=lease / 3) == "done"  # the old code waited out the whole lease
    resumed = time.monotonic() - killed
    row = Worker.objects.get(name=name)
    assert row.stopped_at is not None and "SIGKILL" in row.current
    assert ledger_counts(run.pk) == {"a": 1, "b": 2, "c": 1}
    # Taken back from the killed worker (then the run's end deleted the item).
    assert WorkflowEvent.objects.filter(run=run, type=WorkflowEvent.Type.WORKER_LOST, data__worker=name).exists()
    assert not WorkItem.objects.filter(run=run).exists()
    log = worker.log()
    assert f"Worker process {pid} was killed by SIGKILL" in log
    assert f"Run {run.pk}: delivery 2 of 5 after worker {name} was lost." in log, log
    print(f"resumed {resumed:.1f} s after the SIGKILL, lease {lease:g} s")


def test_reload_restarts_the_worker_when_a_python_file_of_the_project_changes(start_worker):
    """durable_worker --reload (development only): a changed .py file under BASE_DIR restarts the worker."""
    import os

    from tests.conftest import ROOT

    worker = start_worker("--reload", "--grace", "5", burst=False)
    wait_for(lambda: worker.log().count("started (queues") == 1, message="the first worker")
    first = durable.start("tests.three_steps", x=1)
    assert durable.wait(first.pk, timeout=15) == [1, 2, 3]
    edited = ROOT / "tests" / "testapp" / "ledger.py"
    os.utime(edited)  # "saved in the editor"
    wait_for(lambda: worker.log().count("started (queues") == 2, message="a restarted worker")
    assert "tests/testapp/ledger.py changed; restarting the worker." in worker.log()
    second = durable.start("tests.three_steps", x=2)
    assert durable.wait(second.pk, timeout=15) == [2, 3, 4]
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
    assert worker.log().count("stopped after") == 2
    assert "did not stop" not in worker.log()


def test_sigterm_to_a_reloading_worker_lets_the_step_finish(start_worker, tmp_path):
    """The reloader passes one SIGTERM on, once: the worker stops gently (the old one sent two,
    which is the "exit at once" of a second Ctrl-C, so the step in flight was cut off)."""
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 1.5, str(reached))
    worker = start_worker("--reload", burst=False)
    wait_for(reached.exists, message="step b to start")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.log()
    assert "mid-step" not in worker.log()
    assert ledger_counts(run.pk) == {"a": 1, "b": 1}  # b finished; c never started
    assert run_of(run).status == "pending"



STOPPING_CHILD = """
import pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
pathlib.Path(sys.argv[1]).write_text("ready")
time.sleep(60)
"""

COUNTING_RELOADER = """
import subprocess, sys
from pathlib import Path
from django_durable.worker.reloader import Reloader
child, ready, sent = sys.argv[1:4]
send = subprocess.Popen.send_signal
def counted(self, signum):
    with open(sent, "a") as out:
        out.write(f"{int(signum)}\\n")
    send(self, signum)
subprocess.Popen.send_signal = counted
sys.exit(Reloader([sys.executable, child, ready], Path(child).parent, interval=0.2, grace=5).run())
"""


@pytest.mark.processes
@pytest.mark.timeout(60)
def test_the_reloader_passes_one_sigterm_on_once(tmp_path):
    """A worker takes a second SIGTERM as "exit at once": the reloader must send exactly one.

    The signals it sends are counted as it sends them (two sent a moment apart often reach the
    child as one, so counting what the child receives would not see a double send).
    """
    import subprocess
    import sys

    child, ready, sent = tmp_path / "child.py", tmp_path / "ready", tmp_path / "sent"
    child.write_text(STOPPING_CHILD)
    reloader = subprocess.Popen([sys.executable, "-c", COUNTING_RELOADER, str(child), str(ready), str(sent)])
    try:
        wait_for(ready.exists, message="the child to start")
        reloader.send_signal(signal.SIGTERM)
        assert reloader.wait(30) == 0
    finally:
        if reloader.poll() is None:
            reloader.kill()
            reloader.wait()
    assert sent.read_text().split() == [str(int(signal.SIGTERM))]


def test_a_whole_worker_killed_and_started_again_takes_its_runs_back_without_waiting_out_the_lease(
        start_worker, tmp_path):
    """Issue 30: the new worker on the same machine and pid namespace knows its predecessor's process is
    gone (the kernel's boot id and pid namespace, not the host name), and takes its claims back, fenced."""
    lease = 60.0
    reached = tmp_path / "reached"
    run = durable.start("tests.sleep_in_b", 30, str(reached))
    env = {"DURABLE_LEASE_SECONDS": str(lease)}
    first = start_worker(burst=False, env=env)
    wait_for(reached.exists, message="step b to start")
    item = WorkItem.objects.get(run=run)
    name = item.claimed_by
    wait_for(lambda: Worker.objects.filter(name=name, stopped_at__isnull=True).exists(), message="its row")
    assert Worker.objects.get(name=name).machine  # Linux: the boot id and pid namespace are known
    killed = time.monotonic()
    first.kill()  # SIGKILL: nothing handed back, no row stopped
    assert first.wait() == -signal.SIGKILL
    second = start_worker(burst=False, env=env)
    assert durable.wait(run.pk, timeout=lease / 3) == "done", second.log()  # the old code waited out the lease
    resumed = time.monotonic() - killed
    assert ledger_counts(run.pk) == {"a": 1, "b": 2, "c": 1}
    # Taken back from the killed worker (then the run's end deleted the item).
    assert WorkflowEvent.objects.filter(run=run, type=WorkflowEvent.Type.WORKER_LOST, data__worker=name).exists()
    assert not WorkItem.objects.filter(run=run).exists()
    row = Worker.objects.get(name=name)
    assert row.stopped_at is not None and "was gone" in row.current
    assert f"Took back 1 claim(s) of worker {name}: its process is gone (same machine)." in second.log()
    print(f"resumed {resumed:.1f} s after the SIGKILL, lease {lease:g} s")


def test_a_worker_of_another_machine_is_waited_out(start_worker):
    """A row whose machine differs (another host, container or boot) keeps its claims: a pid there says nothing."""
    from django.utils import timezone

    from django_durable.worker import machine, maintenance

    run = durable.start("tests.three_steps", x=1)
    item = WorkItem.objects.get(run=run)
    WorkItem.objects.filter(pk=item.pk).update(status="processing", claimed_by="elsewhere:999999",
                                               claim_expires_at=timezone.now() + timezone.timedelta(hours=1))
    for name, identity in (("elsewhere:999999", "another-boot/pid:[1]"), ("unknown:999998", "")):
        Worker.objects.create(name=name, host="elsewhere", pid=int(name.rpartition(":")[2]), machine=identity,
                              started_at=timezone.now(), last_seen=timezone.now())
    assert machine.gone(999999)  # on this machine no such process exists, yet the row is not of this machine
    assert maintenance.release_dead_neighbours("here:1", "default") == 0
    assert WorkItem.objects.get(pk=item.pk).claimed_by == "elsewhere:999999"


@pytest.mark.parametrize("neighbour_first", [True, False], ids=["neighbour first", "supervisor first"])
def test_the_supervisors_account_of_a_death_is_kept_whoever_saw_it_first(neighbour_first):
    """A slow-starting sibling can find a killed worker's process gone before the supervisor has
    read its exit status (seen on a busy CI machine): the row still ends with how it died."""
    from django.utils import timezone

    from django_durable import workpool

    name, now = "box:4242", timezone.now()
    Worker.objects.create(name=name, host="box", pid=4242, machine="m", started_at=now, last_seen=now)
    accounts = [dict(why="died: its process 4242 was gone when box:4241 started on the same machine"),
                dict(why="died: was killed by SIGKILL", witnessed=True)]
    for account in accounts if neighbour_first else accounts[::-1]:
        workpool.release_worker(name, db="default", **account)
    row = Worker.objects.get(name=name)
    assert row.stopped_at is not None and row.current == "died: was killed by SIGKILL"
