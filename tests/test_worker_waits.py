"""Sleeps, signals and cancellation with real worker processes and real time."""

import datetime as dt
import random
import signal
import threading
import time

import pytest
from django.db import connections

import django_durable as durable
from django_durable.models import SignalMessage, Step, WorkflowRun
from django_durable.testing import drain
from tests.conftest import assert_settled, ledger_counts, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


def test_a_timer_due_while_no_worker_runs_fires_when_one_starts(start_worker):
    """RELIABILITY T21."""
    run = durable.start("tests.sleeper", 2)
    worker = start_worker(burst=False)
    wait_for(lambda: run_of(run).status == "waiting", message="the run to sleep")
    wake_at = Step.objects.get(run=run, key="nap").deadline_at
    worker.kill()
    time.sleep(3)  # past the wake-up time, with no worker at all
    second = start_worker(burst=False)
    assert durable.wait(run.pk, timeout=10) == ["before", "after"]
    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    assert Step.objects.get(run=run, key="nap").deadline_at == wake_at  # recorded once
    after = Step.objects.get(run=run, key="after")
    assert after.started_at >= wake_at  # never early
    assert ledger_counts(run.pk) == {"before": 1, "after": 1}


def test_signals_sent_during_a_step_then_a_crash_after_consuming_the_first(start_worker, tmp_path):
    """RELIABILITY T23: FIFO, and a crash after consuming S1 neither loses nor repeats a signal."""
    reached, release = tmp_path / "reached", tmp_path / "release"
    run = durable.start("tests.two_signals", str(reached), str(release))
    first = start_worker(burst=False, faults="before_step_call=kill@between")
    wait_for(reached.exists, message="the first step to start")
    s1 = durable.signal(run.pk, "go", "S1")  # while the run is in its first step
    s2 = durable.signal(run.pk, "go", "S2")
    release.touch()
    assert first.wait() == -signal.SIGKILL  # right after S1's consumption committed
    assert SignalMessage.objects.get(pk=s1.pk).consumed_by == "signal:go:0"
    assert SignalMessage.objects.get(pk=s2.pk).consumed_at is None

    second = start_worker()
    assert second.wait() == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == ["S1", "S2"]
    consumed = list(SignalMessage.objects.filter(run=run).order_by("id").values_list("consumed_by", flat=True))
    assert consumed == ["signal:go:0", "signal:go:1"]
    assert ledger_counts(run.pk) == {"first": 1, "between": 1}
    assert_settled()


def test_a_signal_sent_while_no_worker_runs_is_kept(start_worker):
    run = durable.start("tests.approval")
    durable.signal(run.pk, "approved", {"by": "alice"})
    worker = start_worker()
    assert worker.wait() == 0, worker.log()
    assert durable.wait(run.pk, timeout=1) == {"by": "alice"}


@pytest.mark.postgres
def test_a_signal_wakes_an_idle_worker_at_once(start_worker):
    worker = start_worker(burst=False, env={"DURABLE_POLL_INTERVAL": "30"})
    run = durable.start("tests.approval")
    wait_for(lambda: run_of(run).status == "waiting", timeout=30, message="the run to wait")
    started = time.monotonic()
    durable.signal(run.pk, "approved", "yes")
    assert durable.wait(run.pk, timeout=10) == "yes"
    assert time.monotonic() - started < 5  # NOTIFY, not the 30 s poll
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0


@pytest.mark.postgres
def test_a_start_committed_before_the_worker_listens_is_claimed_before_it_waits(monkeypatch, settings):
    """A worker listens for notifications when it first runs out of work, not before its first
    claim: the notification of a start that committed before it listened went unheard, so it
    looks for work once more before it waits (with nothing else to wake it, an hour's poll)."""
    from django_durable.worker.process import Worker
    from django_durable.worker.waiter import Waiter

    settings.DURABLE_POLL_INTERVAL = 3600
    listen, started, seen = Waiter.listen, [], []

    def listen_after_a_start(waiter):
        if waiter.listener is None and not started:
            started.append(durable.start("tests.three_steps", x=1))  # committed, notified, unheard
        return listen(waiter)

    def wait(waiter, timeout):
        seen.append(run_of(started[0]).status)
        worker.stop()

    monkeypatch.setattr(Waiter, "listen", listen_after_a_start)
    monkeypatch.setattr(Waiter, "wait", wait)
    worker = Worker(name="w-listens-when-idle")
    assert worker.run() == 0
    assert seen == ["completed"]


@pytest.mark.parametrize("workflow", ["tests.cooperative_cancel", "tests.cancellable"])
def test_cancel_during_a_step_starts_no_later_step(start_worker, tmp_path, workflow):
    """RELIABILITY T25."""
    reached = tmp_path / "reached"
    run = durable.start(workflow, str(reached))
    worker = start_worker(burst=False)
    wait_for(reached.exists, message="the step to start")
    assert durable.cancel(run.pk, reason="stop").status == "running"  # requested, not yet done
    with pytest.raises(durable.WorkflowFailed, match="cancelled"):
        durable.wait(run.pk, timeout=15)
    run = run_of(run)
    assert run.status == "cancelled"
    assert "never" not in ledger_counts(run.pk)
    if workflow == "tests.cooperative_cancel":
        # The step saw ctx.cancel_requested (learnt by the heartbeat) and stopped early.
        assert Step.objects.get(run=run, key="long").get_result() == "stopped early"
        assert run.finished_at - run.cancel_requested_at < dt.timedelta(seconds=5)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
    assert_settled()


def test_cancel_racing_the_last_step_gives_one_terminal_state():
    """RELIABILITY T26: a cancel that committed first wins; otherwise the run completed."""
    from django_durable import faults

    rounds = 200 if connections["default"].vendor == "postgresql" else 50
    outcomes = []
    # How long the canceller waits after the claim, at random up to `spread`: a busy machine moves
    # where the race falls, so while one order has not happened yet the spread moves toward it
    # (longer while every cancel wins, shorter while none does), and the rounds go on (bounded)
    # until both have.
    spread = 0.008
    # Widen the gap between the last step and the terminal commit, and cancel around it.
    faults.arm("before_terminal_commit=sleep:0.004")
    try:
        for round_ in range(rounds * 4):
            if round_ >= rounds and {"completed", "cancelled"} <= set(outcomes):
                break
            if round_ % 10 == 9 and "completed" not in outcomes:
                spread = min(spread * 2, 1.0)
            elif round_ % 10 == 9 and "cancelled" not in outcomes:
                spread /= 2
            run = durable.start("tests.trivial", n=1)
            said = {}

            def canceller():
                try:
                    # Until the run is claimed, or (a slow thread on a busy machine) already over:
                    # bounded either way, so the round never hangs.
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline and WorkflowRun.objects.filter(pk=run.pk, status="pending").exists():
                        time.sleep(0.0005)
                    time.sleep(random.uniform(0, spread))
                    said["cancel"] = durable.cancel(run.pk).status
                except durable.RunFinished as finished:
                    said["cancel"] = f"refused: {finished.status}"
                finally:
                    connections.close_all()

            thread = threading.Thread(target=canceller)
            thread.start()
            drain()
            thread.join(timeout=30)
            assert not thread.is_alive(), "the canceller did not finish"
            final = run_of(run).status
            if said["cancel"].startswith("refused"):
                assert final == "completed" and said["cancel"] == "refused: completed"
            else:
                assert final == "cancelled", (said, final)
            outcomes.append(final)
    finally:
        faults.arm("")
    # Both orders happened, so the race was really run.
    assert {"completed", "cancelled"} <= set(outcomes), outcomes


def test_a_sleep_ends_on_time_not_a_poll_later(start_worker):
    """The worker that set the timer fires it when it is due, whatever the poll interval."""
    run = durable.start("tests.sleeper", 1.0)
    worker = start_worker(burst=False, env={"DURABLE_POLL_INTERVAL": "5"})
    assert durable.wait(run.pk, timeout=15) == ["before", "after"]
    wake_at = Step.objects.get(run=run, key="nap").deadline_at
    late = Step.objects.get(run=run, key="after").started_at - wake_at
    assert dt.timedelta(0) <= late < dt.timedelta(seconds=2.5)  # half the poll interval: not a poll later
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0
