"""Through a transaction pooler (RELIABILITY T43): PgBouncer 1.18 in transaction mode between every
process and PostgreSQL (tests/harness/pooler.py, and the chaos soak with --pooler); and the
prepared statements' names, which make a pooler that loses them an error rather than another
client's statement run with this one's parameters.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection

import django_durable as durable
from django_durable.workpool import statements
from tests import harness

pytestmark = pytest.mark.postgres


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(600)
def test_signals_an_atomic_step_a_cancel_and_one_run_at_a_time_through_pgbouncer():
    done = harness.run("pooler", timeout=540)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert "ended with [1, 2]" in done.stdout and "wrote 1 row" in done.stdout, done.stdout
    assert "the step after it ran 0 times" in done.stdout, done.stdout


@pytest.mark.slow
@pytest.mark.processes
@pytest.mark.timeout(900)
def test_a_minute_of_chaos_through_pgbouncer_breaks_no_promise():
    done = harness.run("chaos", "--duration", "60", "--min-runs", "100", "--pooler", timeout=840)
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    assert "RESULT: ok (0 violation(s))" in done.stdout
    started = int(re.search(r"^\| runs started \| (\d+) \|$", done.stdout, re.M).group(1))
    assert started >= 100, done.stdout


@pytest.mark.django_db(transaction=True)
def test_each_connection_names_its_prepared_statements_apart():
    durable.start("tests.three_steps", x=1)  # a hot statement: the connection is set up for them
    raw = connection.connection
    assert raw in statements._named
    assert raw._prepared._prepared_idx >= 2**20  # not _pg3_0, _pg3_1, … as on every other connection
    connection.close()
    durable.start("tests.three_steps", x=2)
    assert connection.connection._prepared._prepared_idx != raw._prepared._prepared_idx
