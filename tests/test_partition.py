"""A network partition (RELIABILITY T48; tests/harness/partition.py, `make partition`).

A worker host's traffic to PostgreSQL dropped by a packet filter, the link left up: mid-step (an
atomic step's transaction open), mid-batch of tasks and while the host is told to stop. Every run
and task ends with its result, each step and payment once; the cut host notices within the
documented bound, writes nothing for what it lost, listens again, and stops within its bound.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.harness.partition import unavailable

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(900)]  # once, on the PostgreSQL run


def test_a_worker_host_cut_off_by_a_partition_loses_nothing_and_writes_nothing_late():
    why = unavailable()
    if why:
        pytest.skip(f"cannot partition a network here: {why}")
    done = subprocess.run([sys.executable, "-m", "tests.harness.partition"], cwd=ROOT, capture_output=True,
                          text=True, timeout=840)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-8000:]}"
    held = [line for line in done.stdout.splitlines() if line.startswith("ok: ")]
    assert len(held) == 8, done.stdout
