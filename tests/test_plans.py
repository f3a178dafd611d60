"""RELIABILITY T44 plans_independent_of_statistics: every hot statement reads its rows through an
index whatever the tables' statistics say.

A worker's statements are prepared, and PostgreSQL soon runs each with a generic plan, made once
and kept. Made while the tables looked small (a fresh install, never analyzed), a plan that joined
a part of the statement to the table it updates became a nested loop over a scan of that whole
table, and stayed so while the table grew, until autovacuum's first ANALYZE: every finish walked
every pending item. tests/harness/plans.py explains the generic plan of each statement of the
golden file on a database of its own: never analyzed; 100,000 runs loaded and never analyzed;
analyzed nearly empty and then loaded; loaded, every item ended while another session holds its
snapshot, and analyzed again (the statistics count nothing pending in indexes of pending items that
still hold every entry: a lookup of a run's pending branches walked one of them whole); and, for the statements of a converted database, the
journal and the runs partitioned by time, then loaded. No statement may read the work-item, run, journal or
timer tables by a sequential scan, a sort of what it read, or a walk of a whole index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness import plans
from tests.harness.workers import ROOT

pytestmark = [pytest.mark.postgres, pytest.mark.processes, pytest.mark.timeout(300)]


@pytest.mark.parametrize("state", plans.STATES)
def test_every_hot_statement_reads_through_an_index_whatever_the_statistics(state):
    done = subprocess.run([sys.executable, "-m", "tests.harness.plans", os.environ["DURABLE_TEST_DATABASE_URL"], state],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])["statements"]
    planned = [name for name, _, sql in plans.statements(plans.golden_of(state)) if not sql.startswith("SET ")]
    assert sorted(report) == sorted(planned) and len(planned) > 15
    assert {name: found for name, found in report.items() if found} == {}


def test_the_check_finds_each_kind_of_plan_it_refuses():
    """offenders() on plans as EXPLAIN (FORMAT JSON) gives them (a check that cannot fail is a defect)."""
    seq = {"Node Type": "Seq Scan", "Relation Name": "durable_workflow_run"}
    walk = {"Node Type": "Index Scan", "Relation Name": "durable_work_item", "Index Name": "durable_work_item_ready_q",
            "Filter": "run_id = fence.run_id"}
    probe = {"Node Type": "Index Scan", "Relation Name": "durable_work_item", "Index Name": "durable_work_item_pkey",
             "Index Cond": "id = $1"}
    sort = {"Node Type": "Sort", "Sort Key": ["priority DESC"], "Plans": [
        {"Node Type": "Bitmap Heap Scan", "Relation Name": "durable_work_item", "Plans": [
            {"Node Type": "Bitmap Index Scan", "Index Name": "durable_work_item_ready_q", "Index Cond": "queue = $1"}]}]}
    first_ready = {"Node Type": "Limit", "Plans": [{"Node Type": "LockRows", "Plans": [dict(walk)]}]}
    each_queue = {"Node Type": "Sort", "Sort Key": ["picked.priority DESC"], "Plans": [first_ready]}
    assert plans.offenders(seq) == ["Seq Scan on durable_workflow_run"]
    assert plans.offenders(walk) == [
        "Index Scan on durable_work_item using durable_work_item_ready_q with no index condition"]
    assert plans.offenders(sort) == ["Sort (priority DESC)"]
    assert plans.offenders(probe) == plans.offenders(first_ready) == plans.offenders(each_queue) == []
    disabled = {"Node Type": "Limit", "Total Cost": 1e10 + 23, "Plans": [
        {"Node Type": "Index Scan", "Relation Name": "durable_work_item", "Index Name": "durable_work_item_ready",
         "Index Cond": "available_at <= now()", "Total Cost": 1e10 + 20, "Plans": [
             {"Node Type": "Seq Scan", "Relation Name": "durable_queue_control", "Total Cost": 1e10 + 10}]}]}
    assert plans.offenders(disabled) == [
        "Seq Scan on durable_queue_control priced as disabled (a statement this costly is compiled by the JIT at "
        "each execution)"]
