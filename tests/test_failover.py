"""Through a failover (RELIABILITY T42): tests/harness/failover.py, pg_auto_failover's monitor and
two nodes, the primary killed under load, the standby promoted, the old primary back as standby.
`make failover` runs the same and prints the figures."""

from __future__ import annotations

import json

import pytest

from tests import harness

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.processes]


@pytest.mark.timeout(1200)
def test_a_primary_killed_under_load_loses_nothing_and_work_resumes_on_the_promoted_standby():
    done = harness.run("failover", "--seconds", "20", timeout=1100)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    figures = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    assert figures["violations"] == 0
    assert figures["runs"] >= 100 and figures["atomic_rows"] == figures["by_kind"]["atomic"]
