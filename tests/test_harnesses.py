"""A harness a test runs (tests.harness.run) and ends by its time limit takes the process groups it
started with it: no worker or server outlives it to load the rest of the suite (T50)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests import harness

pytestmark = pytest.mark.processes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie whose parent has not reaped it yet is gone too
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.timeout(120)
def test_a_harness_ended_by_its_time_limit_takes_what_it_started_with_it(tmp_path):
    pidfile = tmp_path / "child.pid"
    with pytest.raises(subprocess.TimeoutExpired):
        harness.run("linger", str(pidfile), timeout=10)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 30
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child), "the harness's process group outlived it"


HOLDER = """
import time, django
django.setup()
from django.db import connection
cursor = connection.cursor()
print("holding", connection.vendor, connection.settings_dict["NAME"], flush=True)
while True:
    cursor.execute("BEGIN IMMEDIATE" if connection.vendor == "sqlite" else "BEGIN")
    if connection.vendor == "postgresql":
        cursor.execute("SELECT txid_current()")
    time.sleep(0.3)
    cursor.execute("ROLLBACK")
    time.sleep(0.3)
"""


@pytest.mark.timeout(120)
def test_a_worker_is_frozen_only_outside_a_transaction(worker_env, tmp_path):
    """WorkerProcess.freeze (T10's pause) never leaves a process frozen with its locks held: a
    process that holds a transaction half of the time is frozen in the other half."""
    import signal
    import sys

    from tests.harness.workers import ROOT, WorkerProcess, wait_for, writer_elsewhere

    log = tmp_path / "holder.log"
    with open(log, "w") as out:
        popen = subprocess.Popen([sys.executable, "-c", HOLDER], cwd=ROOT, env=worker_env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    holder = WorkerProcess(popen, log)
    try:
        wait_for(writer_elsewhere, message=f"the holder's transaction (log: {holder.log()})")
        holder.freeze()
        assert holder.stopped()  # every thread, as /proc shows it
        for _ in range(10):  # frozen, it can no longer change what is seen
            assert not writer_elsewhere()
            time.sleep(0.1)
        holder.signal(signal.SIGCONT)
        wait_for(lambda: not holder.stopped(), message="the thawed holder's threads to run again")
        wait_for(writer_elsewhere, message="the thawed holder's next transaction")
    finally:
        holder.kill()
