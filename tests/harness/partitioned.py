"""The journal partitioned by time on a real PostgreSQL, tried as a project would: run by
tests/test_partitioned.py in a process of its own, on a database made for it.

Runs made before the conversion (one finished, one waiting for a signal) and after it (steps,
retries, parallel branches, children) go through real worker processes; then the prune, the
maintenance and the drop. Every check raises AssertionError saying what went wrong; "ok: <check>"
lines say what held.
"""

from __future__ import annotations

import datetime as dt
import io
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def burst() -> str:
    """A real worker process until nothing is left to do; its log."""
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", "2", "--burst"],
                          env=os.environ.copy(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the worker failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def past(moment: dt.datetime) -> None:
    """Wait until the database's clock is past `moment` (the partitions begin at the whole second
    after a conversion: a run started before then is still one of the partition before)."""
    from django_durable import clock

    for _ in range(100):  # at most 5 s: a second is what it can take
        if clock.database_now("default") > moment:
            return
        time.sleep(0.05)
    raise AssertionError(f"the database's clock did not pass {moment}")


def main() -> None:
    django.setup()
    from django.core.management import CommandError, call_command
    from django.db import DatabaseError, IntegrityError, connection, transaction
    from django.db.models.functions import Now

    import django_durable as durable
    from django_durable import partitioning, retention
    from django_durable.models import EPOCH, Step, WorkflowRun
    from tests.testapp import ledger

    call_command("migrate", verbosity=0)

    def where(run) -> Counter:
        """{partition: entries} of a run's journal."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT tableoid::regclass::text, count(*) FROM durable_step WHERE run_id = %s "
                           "GROUP BY 1", [run.pk])
            return Counter(dict(cursor.fetchall()))

    def keys_once(run) -> None:
        keys = Counter(Step.objects.filter(run=run).values_list("key", flat=True))
        assert keys and max(keys.values()) == 1, f"a key recorded twice in {run.workflow}: {keys}"

    # 1. Before: a plain table; the command says so.
    try:
        call_command("durable", "partitions", stdout=io.StringIO())
        raise AssertionError("durable partitions on a plain journal did not refuse")
    except CommandError as exc:
        assert "plain table" in str(exc), exc
    finished = durable.start("tests.five_steps")
    waiting = durable.start("tests.two_signals")
    burst()
    finished.refresh_from_db(), waiting.refresh_from_db()
    assert (finished.status, waiting.status) == ("completed", "waiting"), (finished.status, waiting.status)
    ok("runs made on the plain journal: one finished, one waiting for a signal")
    # The waiting one as if it had been started the moment before the conversion (in the same second).
    WorkflowRun.objects.filter(pk=waiting.pk).update(created_at=Now())

    # 2. The conversion, as a migration with atomic = False runs it (the index built concurrently).
    assert partitioning.layout(refresh=True) is None  # this process read it plain: "a stale writer"
    with connection.schema_editor(atomic=False) as editor:
        partitioning.PartitionJournal(interval="day", ahead=2).database_forwards("app", editor, None, None)
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = 'durable_step'::regclass")
        assert cursor.fetchone()[0] == "p"
    shape = partitioning.layout(refresh=True)
    past(shape.since)
    parts = partitioning.partitions()
    assert parts[0].start is None and parts[0].end == shape.since, parts
    assert len(parts) == 1 + 1 + 2, [p.name for p in parts]  # before, today, two days ahead
    assert where(finished) == Counter({parts[0].name: 5}), where(finished)
    with connection.schema_editor(atomic=False) as editor:  # again: nothing to do
        partitioning.PartitionJournal(interval="day").database_forwards("app", editor, None, None)
    assert [p.name for p in partitioning.partitions()] == [p.name for p in parts]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_statistic WHERE starelid = 'durable_step'::regclass")
        assert cursor.fetchone()[0] > 0, "the parent was not analyzed"
    ok("PartitionJournal: the old table is the partition before, partitions ahead, the parent analyzed; "
       "a second time does nothing")

    # 3. A process that read the journal plain writes entries without their key (1970, the old
    #    table's): refused for a run created since, so no run has entries under two keys.
    stale = durable.start("tests.five_steps")
    try:
        with transaction.atomic():
            Step.objects.create(run=stale, key="a", seq=1, status="completed")
        raise AssertionError("a stale writer wrote an entry of a run created since the conversion")
    except DatabaseError as exc:
        assert "partitioned since" in str(exc), repr(exc)
    assert not Step.objects.filter(run=stale).exists()
    ok("an entry written without its partition key (a process started before) is refused, for a run "
       "created since")

    # 4. Real workers after the conversion: the old waiting run finishes in the old table,
    #    new runs of every kind in today's partition, each step recorded once.
    durable.signal(waiting.pk, "go", 1)
    durable.signal(waiting.pk, "go", 2)
    new = [stale, durable.start("tests.fails_twice"), durable.start("tests.squares", n=6),
           durable.start("tests.parent")]
    burst()
    waiting.refresh_from_db()
    assert waiting.status == "completed" and waiting.get_result() == [1, 2], (waiting.status, waiting.result)
    assert set(where(waiting)) == {parts[0].name}, where(waiting)
    assert set(Step.objects.filter(run=waiting).values_list("run_created_at", flat=True)) == {EPOCH}
    keys_once(waiting)
    children = list(WorkflowRun.objects.filter(parent__in=new))
    for run in new + children:
        run.refresh_from_db()
        expected = "failed" if run.workflow == "tests.child_breaker" else "completed"  # the parent catches it
        assert run.status == expected, (run.workflow, run.status, run.error)
        assert set(where(run)) == {parts[1].name}, (run.workflow, where(run))
        assert set(Step.objects.filter(run=run).values_list("run_created_at", flat=True)) == {run.created_at}
        keys_once(run)
    assert [r["square"] for r in new[2].get_result()] == [i * i for i in range(6)], new[2].result
    assert ledger.count(new[1].pk, "step") == 3 and ledger.count(new[1].pk, "branch") == 3
    ok("after it, real workers finish the waiting run in the old table and new runs (retries, six "
       "branches, children) in today's partition; each key once")

    # 5. Still at most one outcome per step: the unique index holds in the partition.
    entry = Step.objects.filter(run=new[0]).first()
    try:
        with transaction.atomic():
            Step.objects.create(run=new[0], key=entry.key, seq=99, status="completed", run_created_at=entry.run_created_at)
        raise AssertionError("a second outcome of a step was recorded")
    except IntegrityError:
        pass
    ok("a second entry of a step key is refused in a partition")

    # 6. The prune deletes the runs; the old table's entries go with them, the partitions' stay for
    #    the DROP, and maintain drops the partitions whose runs are all gone.
    in_partitions = Step.objects.exclude(run_created_at=EPOCH).count()
    runs, _ = retention.prune(dt.timedelta(0))
    assert runs == 2 + len(new) + len(children), runs
    assert not WorkflowRun.objects.exists()
    assert not Step.objects.filter(run_created_at=EPOCH).exists(), "entries of the old table outlived their runs"
    assert Step.objects.count() == in_partitions > 0, (Step.objects.count(), in_partitions)
    out = io.StringIO()
    call_command("durable", "partitions", stdout=out)
    assert "no run left" not in out.getvalue(), out.getvalue()  # today's and the old one are not past yet
    tomorrow = parts[1].end + dt.timedelta(hours=2)
    gone = [p.name for p in partitioning.droppable(now=tomorrow)]
    assert gone == [parts[0].name, parts[1].name], gone
    done = partitioning.maintain(now=tomorrow)
    assert done["dropped"] == gone, done
    assert Step.objects.count() == 0
    names = [p.name for p in partitioning.partitions()]
    assert names[0] == parts[2].name and parts[0].name not in names, names
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_class WHERE relname = ANY(%s)", [gone])
        assert cursor.fetchone()[0] == 0, "a dropped partition is still there"
    ok("the prune leaves the partitions' entries to the drop; maintain drops the past partitions "
       "with no run left (the old table too)")

    # 7. The command: list and maintain.
    out = io.StringIO()
    call_command("durable", "partitions", "maintain", "--ahead", "4", stdout=out)
    assert "made " in out.getvalue() and "analyzed durable_step" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    call_command("durable", "partitions", stdout=out)
    assert len(out.getvalue().splitlines()) == len(partitioning.partitions()) >= 4, out.getvalue()
    ok("durable partitions lists them; maintain makes them ahead")


if __name__ == "__main__":
    main()
