"""The PostgreSQL statements of the hot path, assembled, against a golden file.

Every statement the workpool sends is printed to `tests/golden/postgres_statements.sql`, so a
change to any of them shows in review as a diff of SQL. After changing a statement on purpose:

    DURABLE_UPDATE_GOLDEN=1 make test    (or the pytest line of this file)

and read the diff before committing it.
"""

from __future__ import annotations

import datetime as dt
import difflib
import os
import uuid
from pathlib import Path

import pytest

import django_durable as durable
from django_durable.journal import StepRecord
from django_durable.workpool import postgres, runs
from django_durable.workpool import statements as sending
from django_durable.workpool.rows import ClaimParams, ClaimRow, Place

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

GOLDENS = {"plain": Path(__file__).parent / "golden" / "postgres_statements.sql",
           # The journal and the runs table in time partitions (partitioning/): each lookup of a
           # run or its entries names its partition.
           "partitioned": Path(__file__).parent / "golden" / "postgres_statements_partitioned.sql"}


@pytest.fixture(params=sorted(GOLDENS))
def layout(request):
    """The tables as plain ones, or as partitioned ones (their layouts as a converted database's)."""
    from django_durable import partitioning

    if request.param == "partitioned":
        since = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
        partitioning.journal._layouts["default"] = partitioning.journal.Layout(since, "month")
        partitioning.runs._layouts["default"] = partitioning.runs.Layout(since, "month")
    yield request.param
    partitioning.journal._layouts.pop("default", None)
    partitioning.runs._layouts.pop("default", None)


class _Claim:
    item_id, run_id, token, db = 7, uuid.UUID(int=1), uuid.UUID(int=2), "default"

    @staticmethod
    def unwritten():  # a batch's claim: its end writes who claimed the run and when
        return "w", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def _record(key="charge", consumes=None):
    return StepRecord(key, 1, "step", "charge", "completed", "42", None, 1, None, None, consumes=consumes)


def _statements() -> list[tuple[str, str, int]]:
    """(name, SQL, number of parameters) of every shape of statement the workpool sends."""
    sent = []

    def execute(db, sql, params):
        sent.append((sql, len(params)))
        nothing_ready = (None,) * 20
        if "durable_workflow_run (id" in sql:  # a start
            return (1, at, at), 1
        if "durable_fair_turn" in sql:  # turns taken before a start_many() in a fair queue: the key's row after
            return (at, 1), 1
        if "given AS (" in sql:  # the run of an item just claimed (partitioned runs)
            return (None,) * 9, 1
        if "written AS (" in sql:  # journal entries written while a step runs
            return (1, False), 1
        if "ending AS (" in sql:  # a batch's completions: [item, status] of each
            return ([[7, "completed"]], None, 0), 1
        # An ending: the fence held, its outcomes (at most three), then the claim's columns.
        return ((1, "completed", None, None, *nothing_ready) if "fence" in sql else nothing_ready), 1

    params = ClaimParams("w", None, "default", uuid.UUID(int=3), 30.0)
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    shapes = [
        ("claim", lambda: postgres.claim(params)),
        ("claim from the claimer's floor", lambda: postgres.claim(params._replace(floor=Place(0, at, 41)))),
        ("claim from some queues, not the items just declined",
         lambda: postgres.claim(params._replace(queues=["emails", "default"], avoid=(5, 6)))),
        ("record a step while it runs", lambda: postgres.record_steps(_Claim, [_record()])),
        ("record a wait that consumes a signal", lambda: postgres.record_steps(_Claim, [_record("approved", 9)])),
        ("finish a run", lambda: postgres.finish_run(_Claim, status="completed", result="1", error=None,
                                                     records=[_record()])),
        ("finish a run and claim the next item", lambda: postgres.finish_run(
            _Claim, status="completed", result="1", error=None, records=[_record()], next_claim=params)),
        ("hand a run back to wait, with a timer and two parallel branches", lambda: postgres.release(
            _Claim, run_status="waiting", waiting_on="sleep", requeue=False, records=[_record()],
            timers=[("sleep", "nap", at)], items=[("a", "g", "m.f", "[]"), ("b", "g", "m.f", "[]")], notify=False)),
        ("hand a run back to the queue and claim the next item", lambda: postgres.release(
            _Claim, run_status="pending", waiting_on="", requeue=True, records=[], timers=[], items=[],
            notify=True, next_claim=params)),
        ("finish a branch", lambda: postgres.finish_branch(
            _Claim, _record(), group="g", failed=False, fail_fast=False, next_claim=params)),
        ("finish a failed branch of a fail-fast group", lambda: postgres.finish_branch(
            _Claim, _record(), group="g", failed=True, fail_fast=True, next_claim=params)),
        ("queue a branch again after its back-off", lambda: postgres.retry_branch(_Claim, _record(), retry_at=at)),
        ("claim from a limited queue (DURABLE_QUEUES)", lambda: _limited(lambda: postgres.claim(params))),
        ("finish a run and claim the next item from a limited queue", lambda: _limited(lambda: postgres.finish_run(
            _Claim, status="completed", result="1", error=None, records=[], next_claim=params))),
        ("start a run", lambda: durable.start("tests.three_steps", x=1)),
        ("start a run just after one that saw a ready item waiting", lambda: _after_one_saw_an_item(
            lambda: durable.start("tests.three_steps", x=1))),
        ("start many runs", lambda: durable.start_many("tests.three_steps", [{"x": 1}, {"x": 2}])),
        ("start a schedule's fire times, each once", lambda: runs.insert_ready(
            [runs.NewRun(uuid.UUID(int=4), "tests.three_steps", "{}", 1, "default", 0, idempotency_key="s:t",
                         scheduled_at=at)], "default", skip_existing=True, notify=False)),
        ("start a run in a fair queue", lambda: _fair(lambda: durable.start(
            "tests.three_steps", x=1, queue="reports", concurrency_key="tenant:1"))),
        ("start many runs in a fair queue", lambda: _fair(lambda: durable.start_many(
            "tests.three_steps", [{"x": 1}, {"x": 2}], queue="reports", concurrency_key="tenant:1"))),
    ]
    from django_durable import partitioning
    from django_durable.workpool import Ending

    if partitioning.runs.layout() is None and partitioning.layout() is None:  # batches: on plain tables only
        shapes += [
            ("claim several items (a batch)", lambda: postgres.claim_many(params, [uuid.UUID(int=5), uuid.UUID(int=6)])),
            ("claim several items from the claimer's floor", lambda: postgres.claim_many(
                params._replace(floor=Place(0, at, 41)), [uuid.UUID(int=5), uuid.UUID(int=6)])),
            ("finish several runs (a batch), with their last journal entries and a signal consumed", lambda: postgres.finish_runs(
                [Ending(_Claim, "1", [_record()], None), Ending(_Claim, "2", [_record("approved", 9)], None)])),
        ]
    if partitioning.runs.layout() is not None:  # a claim's item first, then its run
        claimed = ClaimRow._make((7, "advance", uuid.UUID(int=1), "", 1, at, *(None,) * 14))
        shapes.append(("read the run of the item just claimed", lambda: postgres.run_state(
            "default", claimed, uuid.UUID(int=2), "w")))
    def in_transaction(db, prelude, sql, params, *, all_rows=False):
        sent.extend((before, len(values)) for before, values in prelude)
        answer = execute(db, sql, params)
        return [] if all_rows else answer

    statements = []
    # Every statement goes through statements.execute or statements.in_transaction.
    real, sending.execute = sending.execute, execute
    real_transaction, sending.in_transaction = sending.in_transaction, in_transaction
    try:
        for name, call in shapes:
            sent.clear()
            call()
            for position, (sql, count) in enumerate(sent, 1):
                statements.append((name if len(sent) == 1 else f"{name}, statement {position} of {len(sent)}",
                                   sql, count))
    finally:
        sending.execute, sending.in_transaction = real, real_transaction
    return statements


def _limited(call):
    from django.test import override_settings

    with override_settings(DURABLE_QUEUES={"emails": {"concurrency": 5, "key_concurrency": 1, "rate_limit": "10/s"}}):
        call()


def _after_one_saw_an_item(call):
    """A start within runs.READY_SEEN_SECONDS of one in its process that saw a ready item waiting
    in its queue, each its own transaction (this test's is set aside for the stand-in's call)."""
    import time

    from django.db import connection

    from django_durable.workpool import runs

    atomic, connection.in_atomic_block = connection.in_atomic_block, False
    runs._ready_seen[("default", "default")] = time.monotonic()
    try:
        call()
    finally:
        connection.in_atomic_block = atomic
        runs._ready_seen.clear()


def _fair(call):
    from django.test import override_settings

    with override_settings(DURABLE_QUEUES={"reports": {"fairness": {"weights": {"tenant:1": 2}}}}):
        call()


def _render(statements, layout: str) -> str:
    parts = ["-- The workpool's PostgreSQL statements, assembled from workpool/queries.py"
             + (", where the journal and the runs are partitioned." if layout == "partitioned" else "."),
             "-- Written by tests/test_statements.py; review a diff here like code.", ""]
    for name, sql, count in statements:
        body = "\n".join(line.rstrip() for line in sql.strip("\n").splitlines())
        parts += [f"-- name: {name} ({count} parameters)", body + ";", ""]
    return "\n".join(parts)


def test_the_statements_are_the_reviewed_ones(layout):
    rendered, golden = _render(_statements(), layout), GOLDENS[layout]
    if os.environ.get("DURABLE_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(rendered)
    expected = golden.read_text() if golden.exists() else ""
    if rendered != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), rendered.splitlines(True),
                                            str(golden), "assembled now"))
        pytest.fail("A hot-path statement changed. If on purpose, run with DURABLE_UPDATE_GOLDEN=1 and "
                    f"review the diff of {golden.name}:\n{diff}")


def test_every_parameter_has_a_placeholder(layout):
    for name, sql, count in _statements():
        assert sql.count("%s") == count, name


@pytest.mark.parametrize("queues", [None, ["emails", "default"]])
def test_a_prepared_claim_finds_the_next_item_by_its_index(queues):
    """A worker's claim is a prepared statement, which PostgreSQL soon runs with a generic plan:
    one made once, without the parameters' values. That plan must still take the next item from
    the partial index of pending items; were the status a parameter, it would read and sort every
    work item ever written at each claim."""
    from django.db import connection

    ids = durable.start_many("tests.echo", [[n] for n in range(3000)], queue="emails")
    from django_durable.models import WorkItem

    WorkItem.objects.exclude(run_id__in=ids[:5]).update(status="completed")
    sql, params = postgres._pick(queues, "default")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE durable_work_item")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE durable_pick_probe AS {sending._numbered(sql)}")
        arguments = f"({', '.join(['%s'] * len(params))})" if params else ""
        cursor.execute(f"EXPLAIN EXECUTE durable_pick_probe{arguments}", params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
        cursor.execute("DEALLOCATE durable_pick_probe")
    # durable_work_item_ready or, for some queues, durable_work_item_ready_q: pending items only.
    assert "Index Scan using durable_work_item_ready" in plan, plan
    # No table read whole but the queues paused at runtime (a few rows, read once: a hashed subplan).
    scanned = [line.strip() for line in plan.splitlines() if "Seq Scan" in line]
    assert all(line.startswith("->  Seq Scan on durable_queue_control") for line in scanned), plan
    assert "hashed SubPlan" in plan, plan
    # Nothing is sorted but, for some queues, the first ready item of each (one row per queue).
    sorted_by = [line.strip() for line in plan.splitlines() if "Sort Key:" in line]
    assert all(key.startswith("Sort Key: picked.") for key in sorted_by) and len(sorted_by) == bool(queues), plan


@pytest.mark.parametrize("prepared", [True, False])
def test_a_hot_statement_reads_its_values_as_djangos_cursor_does(settings, prepared):
    """The hot statements read their rows in PostgreSQL's binary format (statements._binary_formats):
    each value comes back equal to, and of the same type as, what Django's own cursor reads, the
    timestamps in Django's timezone and a jsonb value as text."""
    from django.db import connection

    settings.DURABLE_PREPARED_STATEMENTS = prepared
    sql = ("SELECT %s::timestamptz, %s::uuid, %s::bigint, %s::text, %s::boolean, %s::jsonb, %s::json, "
           "%s::integer[], NULL::timestamptz, %s::numeric")
    values = [dt.datetime(2026, 11, 28, 5, 30, 1, 123456, tzinfo=dt.UTC), uuid.uuid4(), 2**40, "é", True,
              '{"a": [1, 2]}', '{"b": null}', [3, 4], 7]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        expected = cursor.fetchone()
    for _ in range(3):  # prepared from its second use
        row, count = sending.execute("default", sql, values)
        assert count == 1
        assert row == expected
        assert [type(value) for value in row] == [type(value) for value in expected]
        assert row[0].tzinfo == expected[0].tzinfo and row[0].utcoffset() == dt.timedelta(0)
        assert row[5] == '{"a": [1, 2]}'


@pytest.mark.parametrize("prepared", [True, False])
def test_a_binary_array_reaches_the_statement_as_a_list_would(settings, prepared):
    """statements.Binary arrays (a batch's ids, tokens and results; start_many's columns) give the
    statement what a list gives, prepared (sent in binary) or not (sent as text by Django's cursor):
    quotes, backslashes, NULLs and empty arrays included."""
    from django.db import connection

    settings.DURABLE_PREPARED_STATEMENTS = prepared
    sql = ("SELECT %s::bigint[], %s::uuid[], %s::text[], %s::varchar[], %s::integer[], %s::timestamptz[], "
           "%s::uuid[], array_length(%s::text[], 1), %s::uuid[], %s::bigint[], %s::boolean[], %s::float8[], "
           "%s::timestamp[], %s::timestamptz[]")
    values = [[1, 2**40], [uuid.uuid4(), None], ['{"a": "\\ \"x\""}', None, "", "é{},"], ["default"], [0, -3],
              [dt.datetime(2026, 11, 29, 3, 0, tzinfo=dt.UTC), None], [], [None, None],
              [None, uuid.uuid4(), None], [-2**63, None, 2**63 - 1], [True, None], [1.5, None],  # (others' types)
              [dt.datetime(2026, 11, 29, 3, 0)], [None, dt.datetime(2026, 11, 29, 4, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5)))]]
    with connection.cursor() as cursor:
        cursor.execute(sql, values)
        expected = cursor.fetchone()
    for _ in range(3):  # prepared from its second use
        row, count = sending.execute("default", sql, [sending.Binary(value) for value in values])
        assert (row, count) == (expected, 1)
    if prepared:  # where prepared, the arrays went in binary, packed by the project's own dumper
        from psycopg.adapt import PyFormat

        from django_durable.workpool.arrays import ArrayDumper

        dumper = connection.connection.adapters.get_dumper(sending.Binary, PyFormat.AUTO)
        assert dumper.format == 1, dumper
        assert dumper is ArrayDumper, dumper


def test_a_binary_array_is_packed_as_psycopg_packs_it():
    """An array of uuids, strs or aware datetimes is sent as the bytes psycopg's own binary list
    dumper sends, under the same type; one of ints as psycopg sends one of bigints (Int8)."""
    from django.db import connection
    from psycopg.adapt import AdaptersMap, PyFormat, Transformer
    from psycopg.types.array import ListBinaryDumper
    from psycopg.types.numeric import Int8

    from django_durable.workpool.arrays import ArrayDumper

    connection.ensure_connection()
    at = dt.datetime(2026, 11, 30, 15, 0, 1, 5, tzinfo=dt.UTC)
    cases = [([uuid.uuid4(), None, uuid.uuid4()], None), (["é", None, "", '{"a": 1}'], None), ([None, at], None),
             ([7, None, -2**40], [Int8(7), None, Int8(-2**40)]), ([uuid.uuid4()] * 100, None)]
    for values, as_psycopg in cases:
        ours, theirs = (AdaptersMap(connection.connection.adapters) for _ in range(2))
        ours.register_dumper(sending.Binary, ArrayDumper)
        theirs.register_dumper(sending.Binary, ListBinaryDumper)
        ours, theirs = Transformer(ours), Transformer(theirs)
        mine = ours.get_dumper(sending.Binary(values), PyFormat.BINARY)
        expected = theirs.get_dumper(sending.Binary(as_psycopg or values), PyFormat.BINARY)
        assert not isinstance(mine, ListBinaryDumper), values  # (packed here, not handed to psycopg's)
        assert (mine.oid, mine.dump(sending.Binary(values))) == \
            (expected.oid, expected.dump(sending.Binary(as_psycopg or values))), values


def _send(how: str, sql: str, params):
    """One statement sent the way `how` names: alone (execute) or in a transaction of its own."""
    if how == "in_transaction":
        return sending.in_transaction("default", [("SELECT %s", [1])], sql, params)
    return sending.execute("default", sql, params)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["execute", "in_transaction"])
@pytest.mark.parametrize("prepared", [True, False])
def test_a_hot_statement_is_sent_as_djangos_cursor_would(settings, how, prepared):
    """The hot statements are sent on psycopg's cursor itself, past Django's wrapper: still, an
    error reaches the caller as Django's (with psycopg's as its cause), a statement in a broken
    transaction is refused, and a connection's execute wrappers see every statement."""
    from django.db import IntegrityError, connection, transaction
    from django.db.transaction import TransactionManagementError

    settings.DURABLE_PREPARED_STATEMENTS = prepared
    import psycopg

    for _ in range(3):  # prepared from its second use
        with pytest.raises(IntegrityError) as raised:
            _send(how, "INSERT INTO durable_work_item (id, kind) VALUES (%s, NULL) RETURNING id", [1])
        assert isinstance(raised.value.__cause__, psycopg.errors.NotNullViolation)
        assert _send(how, "SELECT %s::integer + 1", [1])[0][0] == 2

    seen = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert _send(how, "SELECT %s::integer * 3", [2])[0][0] == 6
    assert any("* 3" in sql for sql in seen), seen

    if how == "execute":  # (in_transaction inside a caller's transaction sends by Django's cursor)
        with transaction.atomic():
            with pytest.raises(IntegrityError):
                with transaction.atomic(savepoint=False), connection.cursor() as cursor:
                    cursor.execute("INSERT INTO durable_work_item (id, kind) VALUES (1, NULL)")
            with pytest.raises(TransactionManagementError):
                sending.execute("default", "SELECT %s::integer", [1])
