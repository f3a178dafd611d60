"""Claiming and ending in batches (PostgreSQL, with a backlog of quick items): each item keeps its
own token and lease, every write stays fenced item by item, and a lone item still goes alone."""

from __future__ import annotations

import uuid

import pytest

import django_durable as durable
from django_durable import workpool
from django_durable.models import WorkflowEvent, WorkflowRun, WorkItem
from tests.conftest import Spy, assert_settled
from tests.testapp import ledger
from tests.testapp import tasks as test_tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def claim_many(k: int, worker: str = "w-batch") -> list[workpool.Claim]:
    return workpool.claim_many(worker=worker, queues=None, db="default", k=k)


def test_a_batch_claims_in_order_each_item_with_its_own_token_and_lease():
    runs = [durable.start("tests.three_steps", x=n) for n in range(5)]
    claims = claim_many(3)
    assert [c.run_id for c in claims] == [r.pk for r in runs[:3]]  # the claim order of one at a time
    assert len({c.token for c in claims}) == 3
    rows = {item.pk: item for item in WorkItem.objects.filter(pk__in=[c.item_id for c in claims])}
    for claim in claims:
        row = rows[claim.item_id]
        assert (row.status, row.claim_token, row.claimed_by, row.attempts) == ("processing", claim.token, "w-batch", 1)
        assert row.claim_expires_at is not None
    # Their runs are not written: each goes from its status to its outcome, its end says who ran it.
    assert set(WorkflowRun.objects.filter(pk__in=[c.run_id for c in claims])
               .values_list("status", "started_at", "last_worker", "last_claimed_at")) == {("pending", None, "", None)}
    assert not any(claim.marked for claim in claims)
    assert [c.run_id for c in claim_many(5)] == [r.pk for r in runs[3:]]  # the rest; none twice


def test_a_batch_of_completions_is_fenced_item_by_item():
    """One claim of the batch taken away (a reaper, an operator) and one run cancelled meanwhile:
    the others complete, the taken one writes nothing, the cancelled one ends cancelled."""
    results = [test_tasks.echo.enqueue(n) for n in range(4)]
    claims = claim_many(4)
    taken, cancelled = claims[1], claims[2]
    WorkItem.objects.filter(pk=taken.item_id).update(claim_token=uuid.uuid4())
    durable.cancel(cancelled.run_id)
    batch = [workpool.Ending(claim, f'"{n}"', [], None) for n, claim in enumerate(claims)]
    finals = {ending.claim.item_id: final for ending, final in workpool.finish_runs(batch)}
    assert finals == {claims[0].item_id: "completed", taken.item_id: None, cancelled.item_id: "cancelled",
                      claims[3].item_id: "completed"}
    assert taken.lost and not claims[0].lost
    status = dict(WorkflowRun.objects.filter(pk__in=[r.id for r in results]).values_list("id", "status"))
    assert [status[c.run_id] for c in claims] == ["completed", "pending", "cancelled", "completed"]
    assert WorkflowRun.objects.get(pk=claims[3].run_id).result == '"3"'
    # Each end wrote who claimed its run and when (the claim wrote nothing on it); the taken one nothing.
    written = {row[0]: row[1:] for row in WorkflowRun.objects.filter(pk__in=[c.run_id for c in claims])
               .values_list("id", "started_at", "last_worker", "last_claimed_at")}
    for claim in (claims[0], cancelled, claims[3]):
        assert written[claim.run_id] == (claim.db_time, "w-batch", claim.db_time)
    assert written[taken.run_id] == (None, "", None)


def test_a_batch_writes_its_runs_last_entries_and_the_messages_they_consume_as_given():
    """The last journal entries of a batch's runs, their empty columns included, and the messages
    they consume are written as given, in batches of one run and of three."""
    import datetime as dt

    from django_durable.journal import StepRecord
    from django_durable.models import SignalMessage, Step

    runs = [durable.start("tests.three_steps", x=n) for n in range(4)]
    for run in (runs[0], runs[2]):  # a message consumed in each batch
        durable.signal(run.pk, "approved", {"by": "ann"})
    first, message = (SignalMessage.objects.get(run_id=run.pk) for run in (runs[0], runs[2]))
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    given = {
        runs[0].pk: [StepRecord("approved", 1, "signal", "approved", "completed", '{"by": "ann"}', None, 1, at, at,
                                fingerprint="f0", consumes=first.pk)],
        runs[1].pk: [StepRecord("b", 1, "step", "m.b", "completed", "2", None, 2, at, at,
                                deadline_at=at + dt.timedelta(seconds=5), remaining=3, match="x")],
        runs[2].pk: [StepRecord("approved", 1, "signal", "approved", "completed", '{"by": "ann"}', None, 1, at, at,
                                consumes=message.pk)],
        runs[3].pk: [StepRecord("d", 1, "step", "m.d", "completed", "4", '{"message": "earlier"}', 3, at, at)],
    }
    for batch in (claim_many(1), claim_many(3)):
        endings = [workpool.Ending(claim, '"done"', given[claim.run_id], None) for claim in batch]
        assert all(final == "completed" for _, final in workpool.finish_runs(endings))
    for run_id, records in given.items():
        record = records[0]
        row = Step.objects.get(run_id=run_id, key=record.key)
        assert (row.seq, row.kind, row.name, row.status, row.result, row.error, row.attempts, row.started_at,
                row.finished_at, row.deadline_at, row.retry_at, row.match, row.remaining, row.fingerprint) == \
            record.values[1:], run_id
    for consumed in (first, message):
        consumed.refresh_from_db()
        assert consumed.consumed_at is not None and consumed.consumed_by == "approved"


def test_a_batch_claim_whose_turn_waits_or_fails_writes_its_claim_with_that_end():
    """The other ends of a turn claimed in a batch: a hand-back to wait moves the run from
    pending (its claim left it so) to waiting, a failure ends it failed; each with its claim."""
    waiting, failing = durable.start("tests.three_steps", x=1), durable.start("tests.three_steps", x=2)
    first, second = claim_many(2)
    assert workpool.release(first, run_status="waiting", waiting_on="a signal")
    assert workpool.finish_run(second, status="failed", result=None, error=None) == "failed"
    rows = {row[0]: row[1:] for row in WorkflowRun.objects.filter(pk__in=[waiting.pk, failing.pk]).values_list(
        "id", "status", "waiting_on", "started_at", "last_worker", "last_claimed_at")}
    assert rows[waiting.pk] == ("waiting", "a signal", first.db_time, "w-batch", first.db_time)
    assert rows[failing.pk] == ("failed", "", second.db_time, "w-batch", second.db_time)


def test_a_batch_claim_still_running_is_marked_running_and_one_ended_is_not():
    """What a worker's maintenance does to the claim in flight a poll on: the run goes `running`,
    as a claim of one writes it at once; a claim whose end committed first leaves nothing to mark."""
    slow, ended = durable.start("tests.three_steps", x=1), durable.start("tests.three_steps", x=2)
    in_flight, done = claim_many(2)
    assert workpool.finish_run(done, status="completed", result="1", error=None) == "completed"
    for claim in (in_flight, done):
        workpool.mark_running(claim)
    assert in_flight.marked
    rows = {row[0]: row[1:] for row in WorkflowRun.objects.filter(pk__in=[slow.pk, ended.pk]).values_list(
        "id", "status", "started_at", "last_worker", "last_claimed_at")}
    assert rows[slow.pk] == ("running", in_flight.db_time, "w-batch", in_flight.db_time)
    assert rows[ended.pk] == ("completed", done.db_time, "w-batch", done.db_time)
    # Marked, its end writes no claim of its own again (the parameters are NULL), and ends it.
    assert workpool.finish_run(in_flight, status="completed", result="2", error=None) == "completed"
    assert WorkflowRun.objects.filter(pk=slow.pk).values_list("status", "started_at").get() == \
        ("completed", in_flight.db_time)


def test_claims_given_back_unstarted_keep_their_place_and_are_not_deliveries():
    runs = [durable.start("tests.three_steps", x=n) for n in range(3)]
    claims = claim_many(3)
    assert workpool.unclaim(claims[1:]) == 2
    items = {i.run_id: i for i in WorkItem.objects.filter(run_id__in=[r.pk for r in runs])}
    assert [(items[r.pk].status, items[r.pk].attempts) for r in runs[1:]] == [("pending", 0), ("pending", 0)]
    assert [c.run_id for c in claim_many(3, worker="w-other")] == [r.pk for r in runs[1:]]


@pytest.mark.parametrize("committed", [False, True])
def test_claims_whose_give_back_went_unanswered_are_given_back_once_the_database_answers(monkeypatch, committed):
    """A give-back whose statement failed (before its commit, or after it with the answer lost)
    gives its claims up all the same, none of them to start, and keeps their tokens: once the
    database answers they are given back as never claimed, not left to a reaper as a lost worker's."""
    from django.db import OperationalError

    from django_durable.workpool import claiming

    runs = [durable.start("tests.three_steps", x=n) for n in range(3)]
    claims = claim_many(3)
    give_back = claiming._give_back

    def unanswered(db, tokens):
        if committed:
            give_back(db, tokens)
        raise OperationalError("the server closed the connection unexpectedly")

    monkeypatch.setattr(claiming, "_give_back", unanswered)
    with pytest.raises(OperationalError):
        workpool.unclaim(claims)
    monkeypatch.setattr(claiming, "_give_back", give_back)
    assert all(claim.lost for claim in claims)
    assert workpool.hand_back_unanswered("default") == (0 if committed else 3)
    assert workpool.hand_back_unanswered("default") == 0  # (once)
    items = {i.run_id: i for i in WorkItem.objects.filter(run_id__in=[r.pk for r in runs])}
    assert [(items[r.pk].status, items[r.pk].attempts, items[r.pk].claim_token) for r in runs] == [("pending", 0, None)] * 3


@pytest.mark.parametrize("answer", ["answered", "failed", "committed, answer lost"])
def test_a_batch_written_behind_a_long_item_sends_its_signals_on_the_main_thread(monkeypatch, answer):
    """The maintenance thread writes the completions a batch holds while an item runs long
    (flush_behind); their signals, user code, wait for the main thread's next flush. A write that
    failed keeps them, renewed, for that flush; one that committed with its answer lost is found
    ended by its own end, not lost to a reaper."""
    import threading

    from django.db import OperationalError

    from django_durable import signals
    from django_durable.worker.process import Worker
    from django_durable.workpool import postgres

    runs = [durable.start("tests.three_steps", x=n) for n in range(3)]
    claims = claim_many(3)
    worker = Worker(name="w-behind")
    for n, claim in enumerate(claims):
        claim.batch = worker._batch
        worker._batch.append(workpool.Ending(claim, f'"{n}"', [], None))
    sent = []  # (run, the thread that sent it)
    receiver = lambda sender, run_id, **kwargs: sent.append((run_id, threading.current_thread().name))  # noqa: E731
    signals.run_completed.connect(receiver, weak=False)
    write = postgres.finish_runs

    def unanswered(endings):
        if answer == "committed, answer lost":
            write(endings)
        raise OperationalError("the server closed the connection unexpectedly")

    if answer != "answered":
        monkeypatch.setattr(postgres, "finish_runs", unanswered)
    failed = []

    def maintenance():
        try:
            worker.flush_behind()
        except OperationalError as exc:
            failed.append(exc)
        finally:
            from django.db import connection

            connection.close()

    try:
        behind = threading.Thread(target=maintenance, name="durable-maintenance")
        behind.start()
        behind.join(timeout=30)
        status = dict(WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("pk", "status"))
        if answer == "answered":
            assert not failed and set(status.values()) == {"completed"} and not sent  # written, not announced
            assert not worker.claims_held()
        else:
            assert failed and len(worker._batch) == 3  # kept, and renewed meanwhile
            assert {c.token for c in worker.claims_held()} == {c.token for c in claims}
            assert set(status.values()) == {"completed" if answer.startswith("committed") else "pending"}
        monkeypatch.setattr(postgres, "finish_runs", write)
        worker._flush()
    finally:
        signals.run_completed.disconnect(receiver)
    assert not len(worker._batch) and not worker.claims_held() and not worker._written
    assert set(WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True)) == {"completed"}
    if answer == "committed, answer lost":  # (a worker whose end's answer was lost sends no signal)
        assert sent == []
    else:
        assert sorted(sent) == sorted((r.pk, threading.main_thread().name) for r in runs)
    assert not WorkflowEvent.objects.filter(run_id__in=[r.pk for r in runs], type=WorkflowEvent.Type.WORKER_LOST).exists()
    assert_settled()


def test_a_worker_with_a_backlog_goes_to_batches_and_back_to_one_at_a_time(monkeypatch):
    from django_durable.worker import process
    from django_durable.worker.process import Worker

    # Every item counts as quick, however busy the machine: an item that took longer than
    # QUICK_SECONDS would end the batches, which a loaded machine's items sometimes do.
    monkeypatch.setattr(process, "QUICK_SECONDS", 3600.0)
    spy = Spy(monkeypatch)
    keys = [f"batch-{n}-{uuid.uuid4()}" for n in range(300)]
    results = [test_tasks.record.enqueue(key) for key in keys]
    workflows = [durable.start("tests.three_steps", x=n) for n in range(50)]
    worker = Worker(burst=True, name="w-in-process")
    assert worker.run() == 0
    assert all(ledger.count(key, "ran") == 1 for key in keys)
    assert WorkflowRun.objects.filter(pk__in=[r.id for r in results], status="completed").count() == 300
    assert [WorkflowRun.objects.get(pk=w.pk).get_result() for w in workflows][:2] == [[0, 1, 2], [1, 2, 3]]
    assert_settled()
    counts = spy.counts
    # 350 runs, most claimed and ended in batches: far fewer statements than items.
    assert counts["claim_many items"] >= 300 and counts["claim_many"] <= counts["claim_many items"] / 4, counts
    assert counts["finish_runs items"] >= 300 and counts["finish_runs"] <= counts["finish_runs items"] / 4, counts
    assert worker._size == 1 and not worker._held and not worker._batch  # alone again once drained


@pytest.mark.timeout(120)
@pytest.mark.parametrize("heartbeat", [10.0, 1.0])
def test_a_slow_task_claimed_in_a_batch_shows_running_while_it_runs(monkeypatch, settings, heartbeat):
    """A claim taken in a batch leaves its run pending; the worker's maintenance writes it running
    a poll after its task began, so that a slow task in a backlog of quick ones shows as running:
    also with a heartbeat no longer than a poll, whose renewals always come before the polls."""
    import threading
    import time

    from django.db import connection

    from django_durable.worker import process
    from django_durable.worker.process import Worker

    monkeypatch.setattr(process, "QUICK_SECONDS", 3600.0)  # however busy the machine: batches
    settings.DURABLE_HEARTBEAT_SECONDS = heartbeat
    spy = Spy(monkeypatch)
    quick = [test_tasks.record.enqueue(f"quick-{n}-{uuid.uuid4()}") for n in range(20)]
    slow = test_tasks.held_at_gate.enqueue(f"slow-{uuid.uuid4()}")
    seen = []  # (the run's status, its last worker, whether started) as the task ran, unmarked and then marked

    def watch():
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                row = WorkflowRun.objects.filter(pk=slow.id).values_list("status", "last_worker", "started_at").get()
                claimed = WorkItem.objects.filter(run_id=slow.id, status="processing").exists()
                if claimed and (row[0], row[1], row[2] is not None) not in seen:
                    seen.append((row[0], row[1], row[2] is not None))
                if row[0] == "running":
                    break
                time.sleep(0.02)
        finally:
            test_tasks.GATE.set()
            connection.close()

    test_tasks.GATE.clear()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert Worker(burst=True, name="w-gated").run() == 0
    finally:
        test_tasks.GATE.set()
        watcher.join()
    assert spy.counts["claim_many items"] >= 10, spy.counts
    # Claimed in a batch, it ran as pending at first; a poll on, it was written running.
    assert seen == [("pending", "", False), ("running", "w-gated", True)], seen
    assert WorkflowRun.objects.filter(pk__in=[r.id for r in [*quick, slow]], status="completed").count() == 21
    assert_settled()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when", ["as it runs", "when it ends"])
def test_claims_taken_ahead_of_a_slow_item_are_given_back(monkeypatch, when):
    """Items claimed in a batch behind one that turns out slow go back to the queue (in their
    places, not deliveries, idle workers told), not kept to wait for it while other workers idle:
    a poll after it began ("as it runs": the maintenance thread gives them back), and at the
    latest once it ends ("when it ends": the item that ends the batches gives them back). The
    completions of the batch that ended before it are written as it runs, not after it."""
    import threading
    import time

    from django.db import connection

    from django_durable.worker import maintenance, process
    from django_durable.worker.process import Worker
    from django_durable.workpool import wakeups

    monkeypatch.setattr(process, "QUICK_SECONDS", 3600.0)  # quick, however busy the machine: batches
    if when == "when it ends":  # the maintenance thread polls too late to act first
        monkeypatch.setattr(maintenance.Maintenance, "_beat", lambda self, claim, now: False)
        monkeypatch.setattr(process, "waited_for_a_core", lambda: None)  # (however long it waited for a core)
    keys = [f"quick-{n}-{uuid.uuid4()}" for n in range(40)]
    quick = [test_tasks.record.enqueue(key) for key in keys[:20]]
    slow_key = f"slow-{uuid.uuid4()}"
    slow = test_tasks.held_at_gate.enqueue(slow_key)
    after = [test_tasks.record.enqueue(key) for key in keys[20:]]
    held = {}  # the claims the worker held taken ahead: as the slow item began, and once it ended
    seen = {}  # as the slow item ran: the items claimed behind it, and whether they went back

    class Watched(Worker):
        def _run_once(self):
            ahead = len(self._held)
            ran = super()._run_once()
            if "ended" not in held and ledger.count(slow_key, "ran"):
                held["began"], held["ended"] = ahead - 1, len(self._held)
            return ran

    def open_the_gate():
        try:
            if not test_tasks.AT_GATE.wait(timeout=60):
                return
            if when == "when it ends":
                process.QUICK_SECONDS = 0.0  # this item ends slow, whatever the clock says
                return
            # Those ahead of it in the batch ran, their completions not written yet.
            unwritten = WorkflowRun.objects.filter(pk__in=[r.id for r in quick]).exclude(status="completed")
            seen["unwritten"] = set(unwritten.values_list("pk", flat=True))
            claimed = WorkItem.objects.filter(status="processing", run_id__in=[r.id for r in after])
            seen["behind"] = set(claimed.values_list("id", flat=True))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (claimed.filter(id__in=seen["behind"]).exists() or unwritten.exists()):
                time.sleep(0.05)
            seen["back"] = not claimed.filter(id__in=seen["behind"]).exists()
            seen["written"] = not unwritten.exists()
        finally:
            test_tasks.GATE.set()
            connection.close()

    test_tasks.GATE.clear()
    test_tasks.AT_GATE.clear()
    opener = threading.Thread(target=open_the_gate)
    opener.start()
    notified = []  # idle workers told the items given back are ready
    notify = wakeups.notify
    monkeypatch.setattr(wakeups, "notify", lambda db: (notified.append(db), notify(db)))
    try:
        assert Watched(burst=True, name="w-ahead").run() == 0
    finally:
        test_tasks.GATE.set()
        opener.join()
    assert held["began"] > 0, held  # it ran in a batch with claims taken ahead behind it
    if when == "as it runs":
        assert seen["behind"] and seen["back"], seen  # back in the queue while it ran
        assert seen["unwritten"] and seen["written"], seen  # and those before it written
    assert held["ended"] == 0, held  # none left waiting once it ended
    assert notified, "idle workers were not told"
    runs = [r.id for r in [*quick, slow, *after]]
    assert WorkflowRun.objects.filter(pk__in=runs, status="completed").count() == 41
    # Given back as never claimed: each delivered once, and no worker counted lost.
    assert not WorkflowEvent.objects.filter(run_id__in=runs, type=WorkflowEvent.Type.WORKER_LOST).exists()
    assert all(ledger.count(key, "ran") == 1 for key in keys)
    assert_settled()


@pytest.mark.parametrize("waited", ["as long as the item ran over", "less", "the system does not say"])
def test_an_item_slow_only_for_want_of_a_core_keeps_the_batch(monkeypatch, waited):
    """An item that took longer than QUICK_SECONDS ends the batches and gives back the claims taken
    ahead, unless the worker's thread spent that time waiting for a core (a busy machine, a CPU
    quota): then the other workers are as short of cores, and the batch goes on."""
    from django_durable.worker import process
    from django_durable.worker.process import QUICK_SECONDS, Worker

    for n in range(4):
        test_tasks.echo.enqueue(n)
    readings = iter([5.0, 5.0 + {"as long as the item ran over": 0.02, "less": 0.001}.get(waited, 0.0)])
    monkeypatch.setattr(process, "waited_for_a_core",
                        lambda: None if waited == "the system does not say" else next(readings))
    worker = Worker(burst=True, name="w-stalled")
    worker._size = 4
    claim = worker._take()
    assert claim is not None and len(worker._held) == 3 and worker._size == 8
    worker._paced(claim, QUICK_SECONDS + 0.01)  # the item ran 10 ms over
    if waited == "as long as the item ran over":
        assert worker._size == 8 and len(worker._held) == 3  # the batch goes on
        assert WorkItem.objects.filter(status="processing").count() == 4
    else:
        assert worker._size == 1 and not worker._held  # one at a time again, the three given back
        assert WorkItem.objects.filter(status="processing").count() == 1
    workpool.unclaim([claim, *worker._held])


@pytest.mark.timeout(60)
def test_the_time_a_thread_waits_for_a_core_is_read_from_the_kernel():
    """waited_for_a_core() grows while this thread shares its one core with a busy process."""
    import os
    import subprocess
    import sys
    import time

    from django_durable.worker.process import waited_for_a_core

    before = waited_for_a_core()
    if before is None:
        pytest.skip("the system does not say how long a thread waits for a core")
    cores = os.sched_getaffinity(0)
    core = min(cores)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(hog.pid, {core})
        os.sched_setaffinity(0, {core})  # this thread and the hog on one core
        deadline = time.monotonic() + 20
        while waited_for_a_core() - before < 0.05 and time.monotonic() < deadline:
            sum(range(10_000))  # runnable: it waits whenever the hog has the core
        waited = waited_for_a_core() - before
    finally:
        os.sched_setaffinity(0, cores)
        hog.kill()
        hog.wait()
    assert waited >= 0.05, waited


def test_a_lone_item_goes_alone_in_one_statement(monkeypatch):
    from django_durable.worker.process import Worker

    spy = Spy(monkeypatch)
    test_tasks.noop.enqueue()
    assert Worker(burst=True, name="w-lone").run() == 0
    assert spy.counts["claim_many"] == 0 and spy.counts["finish_runs"] == 0, spy.counts
    assert_settled()


@pytest.mark.timeout(120)
def test_no_claim_is_left_unrun_when_batches_end_with_claims_still_taken_ahead(monkeypatch):
    """A slow item ends the batches while claims taken ahead wait: those are given back and run
    one at a time after, none left unrun (a chained claim of an end while claims are held would
    overwrite the last one, left neither run nor renewed until a reaper took it back as a lost
    worker's)."""
    from django_durable.worker import process
    from django_durable.worker.process import Worker

    monkeypatch.setattr(process, "QUICK_SECONDS", -1.0)  # every item counts as slow
    worker = Worker(burst=True, name="w-slow")
    runs = [durable.start("tests.three_steps", x=n) for n in range(40)]
    worker._size = 8  # as after a backlog of quick items
    assert worker.run() == 0
    # None redelivered: no worker lost (the reaper would note it), and each run's end deleted its item.
    assert not WorkflowEvent.objects.filter(run_id__in=[r.pk for r in runs], type=WorkflowEvent.Type.WORKER_LOST).exists()
    assert not WorkItem.objects.filter(run_id__in=[r.pk for r in runs]).exists()
    assert WorkflowRun.objects.filter(pk__in=[r.pk for r in runs], status="completed").count() == 40
    assert_settled()
