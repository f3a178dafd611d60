"""Several worker hosts on one PostgreSQL, as network namespaces (tests/harness/hosts.py; `make hosts`).

Hosts A and B each run a worker process against a PostgreSQL server in a third namespace: runs are
shared; cutting A's link mid-step makes its leases lapse and B finish its runs with each step
recorded once; restored, A's late checkpoints are refused (fencing) and it takes new runs; NOTIFY
wakes workers across hosts, and a host whose listening session is killed polls, then listens again.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.harness.hosts import unavailable

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.timeout(600)]  # once, on the PostgreSQL run


def test_worker_hosts_share_runs_and_survive_a_cut_link():
    why = unavailable()
    if why:
        pytest.skip(f"cannot make network namespaces here: {why}")
    done = subprocess.run([sys.executable, "-m", "tests.harness.hosts"], cwd=ROOT, capture_output=True, text=True,
                          timeout=540)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-6000:]}"
    held = [line for line in done.stdout.splitlines() if line.startswith("ok: ")]
    assert len(held) == 5, done.stdout
