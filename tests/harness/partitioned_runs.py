"""The runs table partitioned by time on a real PostgreSQL, tried as a project would: run by
tests/test_partitioned.py in a process of its own, on a database made for it.

Runs made before the conversion (finished, waiting for signals, a parent whose children wait, an
idempotency key, a ticket held one at a time) and after it (steps, retries, branches, children, a
schedule's fire, payloads stored apart) go through real worker processes; then the rules that
must hold across partitions, the claim's plan, and the prune dropping a partition whole. Every
check raises AssertionError saying what went wrong; "ok: <check>" lines say what held.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import re
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import django

from tests.harness.partitioned import burst, ok, past


def main() -> None:
    django.setup()
    from django.core.management import call_command
    from django.db import DatabaseError, connection, connections, transaction

    import django_durable as durable
    from django_durable import ids, partitioning, retention, schedules
    from django_durable.exceptions import SubjectBusy
    from django_durable.models import Schedule, Step, StoredPayload, WorkflowEvent, WorkflowRun, WorkItem
    from django_durable.workpool import postgres, queries, statements
    from django_durable.workpool.rows import ClaimParams
    from tests.testapp import ledger
    from tests.testapp.models import Ticket

    call_command("migrate", verbosity=0)
    runs_table = partitioning.runs.TABLE

    def where(run) -> str:
        """The partition that holds a run."""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT tableoid::regclass::text FROM {runs_table} WHERE id = %s", [run.pk])
            return cursor.fetchone()[0]

    def convert_runs():
        with connection.schema_editor(atomic=False) as editor:
            partitioning.PartitionRuns(interval="day", ahead=2).database_forwards("app", editor, None, None)

    # 1. The runs before the journal: refused, with what to do.
    try:
        convert_runs()
        raise AssertionError("the runs were partitioned before the journal")
    except ValueError as exc:
        assert "Partition the journal first" in str(exc), exc
    ok("PartitionRuns refuses a plain journal and says to partition it first")

    # 2. Runs made on plain tables.
    ticket, other_ticket = Ticket.objects.create(title="printer"), Ticket.objects.create(title="screen")
    finished = durable.start("tests.five_steps")
    waiting = durable.start("tests.two_signals")
    family = durable.start("tests.waiting_parent")
    keyed = durable.start("tests.three_steps", idempotency_key="before")
    held = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
    burst()
    for run, status in ((finished, "completed"), (waiting, "waiting"), (family, "waiting"), (keyed, "completed"),
                        (held, "waiting")):
        run.refresh_from_db()
        assert run.status == status, (run.workflow, run.status, run.error)
    old_children = list(WorkflowRun.objects.filter(parent=family))
    assert len(old_children) == 2, old_children
    ok("runs made on the plain tables: finished, waiting for signals, a parent with waiting children, a key, "
       "a ticket held")

    #    One more started the moment before the conversions, by a process whose clock runs two
    #    seconds ahead of the database's: its id carries a time past the conversion's.
    real_time_ns = time.time_ns
    ids.time.time_ns = lambda: real_time_ns() + 2_000_000_000
    try:
        ahead = durable.start("tests.five_steps")
    finally:
        ids.time.time_ns = real_time_ns

    # 3. The conversions, as migrations with atomic = False run them, right after: the partitions
    #    begin past every run above (their second, and the time of the id from ahead).
    with connection.schema_editor(atomic=False) as editor:
        partitioning.PartitionJournal(interval="day", ahead=2).database_forwards("app", editor, None, None)
    convert_runs()
    shape = partitioning.runs.layout(refresh=True)
    past(shape.since)
    parts = partitioning.runs.partitions()
    assert parts[0].start is None and parts[0].end == shape.since, parts
    assert len(parts) == 1 + 1 + 2, [p.name for p in parts]  # before, today, two days ahead
    before, today = parts[0].name, parts[1].name
    for run in (finished, waiting, family, keyed, held, ahead, *old_children):
        assert where(run) == before, (run.workflow, where(run))
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = %s::regclass", [runs_table])
        assert cursor.fetchone()[0] == "p"
        cursor.execute("SELECT count(*) FROM pg_constraint WHERE confrelid = %s::regclass", [runs_table])
        assert cursor.fetchone()[0] == 0, "a foreign key still references the partitioned runs"
        cursor.execute("SELECT count(*) FROM pg_statistic WHERE starelid = %s::regclass", [runs_table])
        assert cursor.fetchone()[0] > 0, "the parent was not analyzed"
    convert_runs()  # again: nothing to do
    assert [p.name for p in partitioning.runs.partitions()] == [p.name for p in parts]
    ok("PartitionRuns: the old table is the partition before, partitions ahead, no foreign key left, the "
       "parent analyzed; a second time does nothing")

    # 4. The database's partition key of an id is the engine's, for every kind of id.
    samples = [uuid.uuid4(), ids.legacy_child_id(family.pk, "a"), finished.pk, ids.uuid7(),
               ids.child_id(ids.uuid7(), "k"), ids.scheduled_id("s", dt.datetime.now(dt.timezone.utc)),
               ids.child_id(finished.pk, "k")]
    with connection.cursor() as cursor:
        for sample in samples:
            cursor.execute("SELECT durable_run_id_time(%s)", [sample])
            assert cursor.fetchone()[0] == ids.id_time(sample, shape.since), sample
    ok("durable_run_id_time() in SQL gives the partition key ids.id_time() gives, for each kind of id")

    # 5. A process that read the runs table plain writes 1970 as a new run's key: refused.
    partitioning.runs._layouts[connection.alias] = None
    try:
        with transaction.atomic():
            WorkflowRun.objects.create(workflow="tests.five_steps")
        raise AssertionError("a stale writer wrote a run without its partition key")
    except DatabaseError as exc:
        assert "partitioned since" in str(exc), repr(exc)
    finally:
        partitioning.runs.layout(refresh=True)
    ok("a run written without its partition key (a process started before) is refused")

    # 6. Real workers after the conversion: the old runs go on in the old partition, new ones of
    #    every kind in today's; each child in its parent's partition; a schedule's fire in its own.
    durable.signal(waiting.pk, "go", 1)
    durable.signal(waiting.pk, "go", 2)
    new = [durable.start("tests.five_steps"), durable.start("tests.fails_twice"), durable.start("tests.squares", n=6),
           durable.start("tests.parent"), durable.start("tests.big_payloads")]
    durable.ensure_schedule("partitioned-tick", "tests.trivial", interval=3600, catch_up="latest")
    Schedule.objects.filter(slug="partitioned-tick").update(next_fire_at=shape.since)
    assert schedules.tick(db=connection.alias) == 1
    fired = Schedule.objects.get(slug="partitioned-tick").last_run
    burst()
    waiting.refresh_from_db()
    assert waiting.status == "completed" and waiting.get_result() == [1, 2], (waiting.status, waiting.result)
    assert where(waiting) == before
    ahead.refresh_from_db()  # found by its id in the partition it is in, and run there
    assert ahead.status == "completed" and where(ahead) == before, (ahead.status, where(ahead))
    assert sorted(Step.objects.filter(run=ahead).values_list("key", flat=True)) == [f"s{i}" for i in range(5)]
    children = list(WorkflowRun.objects.filter(parent__in=new))
    assert len(children) == 3, children
    for run in new + children + [fired]:
        run.refresh_from_db()
        expected = "failed" if run.workflow == "tests.child_breaker" else "completed"  # the parent catches it
        assert run.status == expected, (run.workflow, run.status, run.error)
        assert where(run) == today, (run.workflow, where(run))
        keys = Counter(Step.objects.filter(run=run).values_list("key", flat=True))
        assert not keys or max(keys.values()) == 1, (run.workflow, keys)
    for child in children:
        assert child.id_time == WorkflowRun.objects.get(pk=child.parent_id).id_time, child
    assert fired.id_time == Schedule.objects.get(slug="partitioned-tick").last_fire_at, fired.id_time
    assert ledger.count(new[1].pk, "step") == 3 and ledger.count(new[1].pk, "branch") == 3
    assert all(ledger.count(new[2].pk, f"square:{i}") == 1 for i in range(6))
    assert StoredPayload.objects.filter(run_id=new[4].pk).exists(), "the big step result was not stored apart"
    ok("real workers finish the old runs in the old partition (one whose id came from a clock ahead too) and "
       "new ones (retries, six branches, children, a schedule's fire, payloads stored apart) in today's, each "
       "child with its parent; each key once")

    # 7. An idempotency key holds across partitions, and under concurrent starts.
    again = durable.start("tests.three_steps", idempotency_key="before")
    assert again.pk == keyed.pk and getattr(again, "created_now", True) is False, (again.pk, keyed.pk)
    started, errors = [], []

    def start_keyed():
        try:
            started.append(durable.start("tests.three_steps", idempotency_key="after").pk)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=start_keyed) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and len(started) == 8 and len(set(started)) == 1, (errors, started)
    assert WorkflowRun.objects.filter(idempotency_key="after").count() == 1
    ok("an idempotency key from before the conversion gives its old run; 8 concurrent starts with a new key, one run")

    # 8. One unfinished run per subject, across partitions: the ticket held before still holds it.
    try:
        durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
        raise AssertionError("a second unfinished run of a ticket started")
    except SubjectBusy as exc:
        assert exc.run_id == held.pk, (exc.run_id, held.pk)
    durable.signal(held.pk, "resolved")
    burst()
    successor = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
    assert where(successor) == today
    try:
        durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
        raise AssertionError("a second unfinished run of a ticket started")
    except SubjectBusy:
        pass
    durable.start("tests.ticket_flow", other_ticket.pk, subject=other_ticket)  # another subject is free
    ok("one_at_a_time holds across partitions: refused while the old run waits, free once it ended, held again")

    # 9. A claim takes the item alone; its run is read by a statement given the run's partition,
    #    which PostgreSQL leaves the others out of before it starts: as the worker sends it,
    #    prepared, with a plan made once.
    pending = durable.start("tests.five_steps")
    ctes, select, params, _ = postgres._claim_parts(ClaimParams("explain", None, connection.alias, uuid.uuid4(), 30))
    assert runs_table not in ctes + select, "the claim's statement reads the runs"
    state = postgres._fill(queries.RUN_STATE, entry=postgres._ENTRY, message=postgres._MESSAGE, child=postgres._CHILD)
    key = partitioning.runs.key(pending.pk)
    item, token = WorkItem.objects.get(run=pending, kind="advance"), uuid.uuid4()
    with transaction.atomic(), connection.cursor() as cursor:
        WorkItem.objects.filter(pk=item.pk).update(status="processing", claim_token=token)  # claimed, as by a claim
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("PREPARE run_state AS " + statements._numbered(state))
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) EXECUTE run_state (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                       [item.pk, token, "explain", pending.pk, "advance", "", key, key, key])
        plan = "\n".join(row[0] for row in cursor.fetchall())
        transaction.set_rollback(True)
    scanned = set(re.findall(rf"Scan (?:using \S+ )?on ({runs_table}_\w+)", plan))  # what is read, not the
    # UPDATE's list of the partitions it may write
    pruned = plan.count("Subplans Removed")
    assert scanned == {where(pending)} and pruned == 3 and "Update on" in plan, plan
    assert "(actual rows=1" in plan.splitlines()[0], plan  # the fence held: the run's row came back
    ok("a claim's statement takes the item alone; its run's is given the partition and reads only that one "
       f"(its {pruned} lookups of runs pruned before it starts)")

    # 10. Between drops, the nightly prune leaves a time partition's runs to the drop (one interval
    #     more), and deletes those of the partition from before as soon as they are past retention.
    late = durable.start("tests.five_steps")
    burst()
    grace = retention.grace()
    assert grace == dt.timedelta(days=1), grace
    cohort = retention.Cohort(dt.timedelta(0))
    soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)
    waiting_for_drop = set(cohort.runs(soon, grace).values_list("pk", flat=True))
    assert late.pk not in waiting_for_drop and finished.pk in waiting_for_drop, waiting_for_drop
    assert late.pk in set(cohort.runs(soon + grace, grace).values_list("pk", flat=True))
    assert retention.grace(dt.timedelta(days=3)) is None  # an explicit age deletes what it names
    ok("the nightly prune waits one interval for a time partition's drop, not for the partition from before")

    # 11. The prune drops a past partition whole once every run in it is past its retention: an
    #     unfinished run holds it; then what hangs off its runs goes, stored files too.
    durable.signal(successor.pk, "resolved")
    burst()
    tomorrow = parts[1].end + dt.timedelta(hours=2)
    unfinished = list(WorkflowRun.objects.filter(id_time__gte=parts[1].start, id_time__lt=parts[1].end)
                      .exclude(status__in=WorkflowRun.TERMINAL))
    assert unfinished, "a run of today should still be unfinished (the other ticket's)"
    assert retention.expired_partitions(dt.timedelta(0), now=tomorrow) == [], "an unfinished run did not hold it"
    for run in unfinished:
        durable.signal(run.pk, "resolved")
    burst()
    gone = list(WorkflowRun.objects.filter(id_time__gte=parts[1].start, id_time__lt=parts[1].end)
                .values_list("pk", flat=True))
    files = [Path(os.environ["DURABLE_TEST_OFFLOAD_DIR"]) / name
             for name in StoredPayload.objects.filter(run_id__in=gone).values_list("name", flat=True)]
    assert files and all(f.exists() for f in files), files
    assert retention.expired_partitions(dt.timedelta(0), now=tomorrow) == [today]
    assert retention.drop_partition(today, batch=7) == len(gone)
    assert today not in [p.name for p in partitioning.runs.partitions()]
    assert not WorkflowRun.objects.filter(pk__in=gone).exists()
    for model in (WorkItem, WorkflowEvent, StoredPayload):
        assert not model.objects.filter(run_id__in=gone).exists(), model.__name__
    assert not any(f.exists() for f in files), "a stored payload's file outlived its run"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM durable_run_idempotency WHERE run_id = ANY(%s)", [gone])
        assert cursor.fetchone()[0] == 0
    assert Schedule.objects.get(slug="partitioned-tick").last_run_id is None
    family.refresh_from_db()  # the old partition's runs are all there
    assert family.status == "waiting" and WorkflowRun.objects.filter(parent=family).count() == 2
    journal_today = [p.name for p in partitioning.partitions() if p.start is not None and p.start <= parts[1].start < p.end]
    done = partitioning.maintain(now=tomorrow)
    assert journal_today and journal_today[0] in done["dropped"], (journal_today, done)
    assert not Step.objects.filter(run_id__in=gone).exists(), "journal entries outlived their partition"
    ok(f"a past partition with an unfinished run is kept; once all {len(gone)} runs are past their retention it "
       "is dropped, their items, events, keys and stored files deleted first; the journal's goes with maintain")

    # 12. The command lists both tables.
    out = io.StringIO()
    call_command("durable", "partitions", stdout=out)
    assert f"{runs_table}_p" in out.getvalue() and "durable_step_p" in out.getvalue(), out.getvalue()
    ok("durable partitions lists the runs' partitions with the journal's")


if __name__ == "__main__":
    main()
