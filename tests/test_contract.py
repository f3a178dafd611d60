"""T46 every_implementation_the_same_row: every workpool transition writes the same whole rows,
whichever implementation writes them (tests/harness/contract.py runs them).

The SQLite pass runs ``sqlite`` and ``sqlite-batch`` (claim_many() and finish_runs()); the
PostgreSQL pass ``postgres`` (one at a time),
``postgres-batch`` (claim_many() and finish_runs()) and ``partitioned`` (in a database of its
own). Each implementation's snapshots must equal tests/golden/contract_rows.json, the rows every
implementation agrees on; DURABLE_UPDATE_GOLDEN=1 writes it from the implementation that runs
(review its diff like code). A few statements about those rows are asserted here too, so that
the expected file itself cannot hold a broken promise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import ON_POSTGRES, ROOT, Spy
from tests.harness import contract

GOLDEN = Path(__file__).parent / "golden" / "contract_rows.json"

pytestmark = pytest.mark.django_db(transaction=True)


def _cells(value, where=""):
    """Every leaf of a snapshot by its path (table[row].column)."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _cells(inner, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from _cells(inner, f"{where}[{index}]")
    else:
        yield where, value


def differences(expected: dict, found: dict) -> list[str]:
    """Each cell where `found` differs from `expected`, as "state/transition path: expected != found"."""
    lines = []
    for state in contract.STATES:
        for transition in contract.TRANSITIONS:
            want, got = dict(_cells(expected[state][transition])), dict(_cells(found[state][transition]))
            for path in sorted(set(want) | set(got)):
                if want.get(path, "(none)") != got.get(path, "(none)"):
                    lines.append(f"{state}/{transition} {path}: {want.get(path, '(none)')!r} != "
                                 f"{got.get(path, '(none)')!r}")
    return lines


def expected(implementation: str) -> dict:
    """The rows `implementation` must write: the golden file's, but for a claim taken in a batch,
    which leaves its run as it was (queries.CLAIM_MANY) while its turn goes on (claimed, steps
    recorded) or when it is given back unstarted; the other ends of its turn write what a claim of
    one item writes, and so agree with the file."""
    golden = json.loads(GOLDEN.read_text())
    if implementation in contract.BATCHES:
        for state in contract.STATES:
            for transition in ("claim", "record_steps", "unclaim"):
                golden[state][transition]["rows"]["run"][0].update(contract.UNCLAIMED)
    return golden


def _compare(found: dict, implementation: str) -> None:
    if os.environ.get("DURABLE_UPDATE_GOLDEN") and implementation not in contract.BATCHES:
        GOLDEN.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    different = differences(expected(implementation), found)
    assert not different, (f"{implementation} writes other rows than the contract's (expected != written):\n"
                           + "\n".join(different))


def _on_this_database():
    return ["postgres", "postgres-batch"] if ON_POSTGRES else ["sqlite", "sqlite-batch"]


@pytest.mark.parametrize("implementation", _on_this_database())
def test_every_transition_writes_the_contracts_rows(implementation):
    _compare(contract.run_all(implementation), implementation)


def test_a_batch_claim_answers_in_the_order_one_claim_at_a_time_takes_items():
    """Backend.claim_many, every implementation: the highest priority first, as claim() would.
    On PostgreSQL an UPDATE's rows come back in the order its join read them: a plan that reads the
    items as they were stored (forced here: a hash join over the items' primary key) answers the
    highest priority last, stored last; the claims still come back in the pick's order."""
    from django.db import connection

    import django_durable as durable
    from django_durable import workpool

    runs = [durable.start("tests.echo", n, priority=n) for n in range(6)]  # stored lowest priority first
    if ON_POSTGRES:
        connection.close()  # a new session: no plan prepared under other settings
        with connection.cursor() as cursor:
            cursor.execute("SET enable_nestloop TO off")
            cursor.execute("SET enable_mergejoin TO off")
    try:
        claims = workpool.claim_many(worker="w-order", queues=None, db="default", k=6)
    finally:
        connection.close()
    assert [c.run_id for c in claims] == [r.pk for r in reversed(runs)]


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_the_partitioned_layout_writes_the_contracts_rows():
    import psycopg

    server = os.environ["DURABLE_TEST_DATABASE_URL"]
    name = f"durable_contract_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DURABLE_TEST_DB_NAME": name}
        for argv in (["convert"], []):
            done = subprocess.run([sys.executable, "-m", "tests.harness.contract", *argv], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    _compare(json.loads(done.stdout), "partitioned")


def test_the_contracts_rows_keep_the_promises():
    """What the expected rows must say, whatever wrote them: a completed run carries no error of an
    earlier attempt; a run's end deletes its advance item and leaves its branches' items; every
    other end frees the item whole (no claim, no missing-code stamp, ready at its turn); a cancel
    requested first wins and keeps its error."""
    expected = json.loads(GOLDEN.read_text())
    completed = expected["earlier_failure"]["complete"]["rows"]["run"][0]
    assert (completed["status"], completed["error"], completed["result"]) == ("completed", None, '"ok"')
    cancelled = expected["cancel_requested"]["complete"]["rows"]["run"][0]
    assert (cancelled["status"], cancelled["result"]) == ("cancelled", None) and "Cancelled" in cancelled["error"]
    for state in contract.STATES:
        for transition in ("complete", "fail"):
            items = expected[state][transition]["rows"]["work_items"]
            assert [item["kind"] for item in items] == ["step", "step"], (state, transition, items)
        for transition in ("wait", "requeue", "retry_run"):
            (advance,) = [item for item in expected[state][transition]["rows"]["work_items"]
                          if item["kind"] == "advance"]
            assert (advance["claim_token"], advance["claimed_by"], advance["missing_since"], advance["step_key"]) \
                == (None, "", None, ""), (state, transition, advance)
        requeued = [item for item in expected[state]["requeue"]["rows"]["work_items"] if item["kind"] == "advance"]
        assert requeued[0]["available_at"] == "turn", requeued


@pytest.mark.postgres
@pytest.mark.processes
@pytest.mark.timeout(300)
def test_runs_retried_as_a_whole_end_without_the_first_attempts_error_when_workers_batch(start_worker):
    """As reported from outside: runs that failed once as a whole and then completed, drained by
    worker processes in batches, kept the first attempt's error (87 of 150)."""
    import signal
    import time

    import django_durable as durable
    from django_durable.models import WorkflowRun

    ids = durable.start_many("tests.fails_once_as_a_run", [{} for _ in range(120)])
    workers = [start_worker(burst=False, concurrency=4) for _ in range(2)]
    runs = WorkflowRun.objects.filter(pk__in=ids)
    deadline = time.monotonic() + 240
    while runs.unfinished().exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()
    assert set(runs.values_list("status", "attempt")) == {("completed", 2)}
    assert not runs.filter(error__isnull=False).exists(), runs.filter(error__isnull=False).count()


@pytest.mark.timeout(120)
def test_an_item_whose_run_was_deleted_behind_djangos_back_ends_without_running(monkeypatch):
    """Work items and journal entries keep their run's id with no constraint in the database, so a
    run deleted by hand (SQL, not Django's cascading delete) can leave its items behind. Every
    implementation's claim finds no run for such an item: the worker ends it (deletes it, as a
    run's end does), runs nothing and writes no journal entry, one at a time and in batches, and
    the other runs are done as usual."""
    from django.db import connection

    import django_durable as durable
    from django_durable.models import Step, WorkflowRun, WorkItem
    from django_durable.worker import process
    from django_durable.worker.process import Worker
    from tests.testapp import ledger
    from tests.testapp import tasks as test_tasks

    monkeypatch.setattr(process, "QUICK_SECONDS", 3600.0)  # batches however busy the machine
    spy = Spy(monkeypatch)
    keys = [f"gone-{n}-{uuid.uuid4()}" for n in range(40)]
    gone = [test_tasks.record.enqueue(key).id for key in keys[:30]]
    gone += [durable.start("tests.three_steps", x=n).pk for n in range(10)]
    kept = [test_tasks.record.enqueue(key).id for key in keys[30:]]
    WorkflowRun.objects.filter(pk__in=gone)._raw_delete(connection.alias)  # no cascade

    assert Worker(burst=True, name="w-orphans").run() == 0
    assert [ledger.count(key, "ran") for key in keys[:30]] == [0] * 30
    assert [ledger.count(key, "ran") for key in keys[30:]] == [1] * 10
    assert not WorkItem.objects.filter(run_id__in=gone).exists()
    assert not Step.objects.filter(run_id__in=gone).exists()
    assert WorkflowRun.objects.filter(pk__in=kept, status="completed").count() == 10
    assert spy.counts["claim"] >= 1, spy.counts  # the first item alone
    if ON_POSTGRES:  # the backend that claims ahead took the rest in batches
        assert spy.counts["claim_many items"] >= 30, spy.counts
