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
