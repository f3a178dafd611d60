"""The chaos soak (tests/harness/chaos.py, `make chaos`) in short: a minute of SIGKILLs, PostgreSQL crash
restarts, paused workers and random database errors breaks no promise; and the soak's checks catch
each promise broken on purpose. It starts a PostgreSQL server of its own."""

import os
import re
import subprocess
import sys

import pytest

from tests.harness.chaos import BREAKS
from tests.conftest import ROOT

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def soak(*args, timeout):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    return subprocess.run([sys.executable, "-m", "tests.harness.chaos", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def figure(table, name):
    return re.search(rf"^\| {re.escape(name)} \| (.*) \|$", table, re.M).group(1)


@pytest.mark.timeout(900)
def test_a_minute_of_chaos_breaks_no_promise():
    result = soak("--duration", "60", "--min-runs", "100", "--db-faults", timeout=840)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    table = result.stdout
    assert "RESULT: ok (0 violation(s))" in table
    # The faults really happened.
    assert int(figure(table, "worker processes SIGKILLed")) >= 3
    assert int(figure(table, "PostgreSQL crash restarts")) >= 1
    assert int(figure(table, "workers paused past their lease")) >= 1
    assert int(figure(table, "runs started")) >= 100


@pytest.mark.timeout(600)
def test_the_soak_catches_each_promise_broken_on_purpose():
    result = soak("--duration", "25", "--no-faults", "--break", ",".join(BREAKS), timeout=540)
    table = result.stdout
    assert result.returncode == 1, table + result.stderr[-5000:]
    assert "broken on purpose: " in table
    for mode, invariant in BREAKS.items():
        assert mode in table.splitlines()[0], f"--break {mode} found nothing to break\n{result.stderr[-3000:]}"
        assert int(figure(table, invariant)) >= 1, f"--break {mode}: {invariant!r} not reported\n{table}"


@pytest.mark.timeout(400)
def test_t07_postgres_restarts_in_the_middle_of_a_sweep_and_no_run_is_stranded():
    """RELIABILITY T07 (tests/harness/restarts.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    result = subprocess.run([sys.executable, "-m", "tests.harness.restarts"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=360)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "200 runs completed, 0 work items left, sweep error logged: True" in result.stdout


def tasks_soak(*args, timeout):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    return subprocess.run([sys.executable, "-m", "tests.harness.tasks_soak", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(600)
def test_tasks_under_sigkills_end_successful_each_rerun_explained_by_a_kill():
    """The tasks soak (tests/harness/tasks_soak.py, `make soak-tasks`) in short."""
    result = tasks_soak("--duration", "30", "--baseline", "10", "--kills", "5", "--rate", "20", "--burst", "200",
                        timeout=540)
    table = result.stdout
    assert result.returncode == 0, table + result.stderr[-5000:]
    assert "RESULT: ok (0 violation(s))" in table
    assert int(figure(table, "worker processes SIGKILLed")) == 5
    assert int(figure(table, "tasks enqueued")) >= 500


@pytest.mark.timeout(400)
def test_the_tasks_soak_catches_a_lost_task_and_a_stale_claim():
    result = tasks_soak("--duration", "8", "--baseline", "4", "--kills", "0", "--burst", "50",
                        "--break", "lost-task,stale-claim", timeout=360)
    table = result.stdout
    assert result.returncode == 1, table + result.stderr[-5000:]
    assert int(figure(table, "every task ended SUCCESSFUL")) == 1
    assert int(figure(table, "nothing left claimed or queued")) == 1
