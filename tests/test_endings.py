"""T41 every_ending_the_same: a run ends the same, with everything its end drags along, whoever ends it.

A child run (`kid`) waits for a signal with a timeout, under a workflow deadline, with a branch
not started yet, an attached and a detached child of its own, and a parent waiting for it. Each
ender ends it: its worker (completed, failed; on whichever database this pass runs: the SQLite
and the PostgreSQL finish are each checked on their own pass), a cancel, a forced failure, the
reaper's poison verdict, its deadline, its code missing past the grace, and its subject's
deletion. For each, the same: a terminal status and finish time set once; its timers and its
branch cancelled; its attached child cancelled unless it completed, its detached child left
alone; its parent woken and told; a durable.wait() told (NOTIFY, on PostgreSQL); the end's signal
sent once, after commit. A django.tasks task's run ends the same way, with task_finished once.
"""

from __future__ import annotations

import datetime as dt
import select
import types
import uuid

import pytest
from django.db import connection

import django_durable as durable
from django_durable import registry, signals, workpool
from django_durable.engine.replay import advance
from django_durable.models import Timer, WorkflowRun, WorkItem
from django_durable.testing import clock, drain
from tests.conftest import ON_POSTGRES
from tests.testapp.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)


@durable.workflow("tests.endings.grandchild")
def grandchild(ctx):
    return ctx.wait_for_signal("never")


@durable.workflow("tests.endings.kid", timeout=dt.timedelta(hours=1))
def kid(ctx):
    ctx.start_child("attached", grandchild)
    ctx.start_child("detached", grandchild, detached=True)
    told = ctx.wait_for_signal("end", timeout=dt.timedelta(hours=2))
    if told == "fail":
        raise RuntimeError("told to fail")
    return "done"


@durable.workflow("tests.endings.parent")
def parent(ctx):
    try:
        return {"kid": ctx.child("kid", kid)}
    except durable.ChildFailed as failure:
        return {"kid ended": failure.status}


def _claim_advance(run_pk):
    """Claim the run's advance as a worker would (its branch, not due, is not ready)."""
    durable.signal(run_pk, "nudge")  # its advance is ready again
    claim = workpool.claim(worker="w", queues=None, db="default")
    assert claim is not None and claim.run_id == run_pk and claim.kind == WorkItem.Kind.ADVANCE
    return claim


# -- the enders -------------------------------------------------------------------------------------


def worker_completes(run, env):
    durable.signal(run.pk, "end", "done")
    claim = workpool.claim(worker="w", queues=None, db="default")
    assert advance(claim) == "completed"
    return "completed"


def worker_completes_in_a_batch(run, env):
    """The completion waits in a batch and is written by finish_runs (on PostgreSQL FINISH_RUNS)."""
    durable.signal(run.pk, "end", "done")
    (claim,) = workpool.claim_many(worker="w", queues=None, db="default", k=2)
    claim.batch = workpool.Batch()
    assert advance(claim) == "completed" and len(claim.batch) == 1
    assert [final for _, final in workpool.finish_runs(claim.batch.take())] == ["completed"]
    return "completed"


def worker_fails(run, env):
    durable.signal(run.pk, "end", "fail")
    claim = workpool.claim(worker="w", queues=None, db="default")
    assert advance(claim) == "failed"
    return "failed"


def cancel(run, env):
    durable.cancel(run.pk, "enough")
    return "cancelled"


def force_fail(run, env):
    durable.force_fail(run.pk, "stop it")
    return "failed"


def poison(run, env):
    claim = _claim_advance(run.pk)
    WorkItem.objects.filter(pk=claim.item_id).update(attempts=env.settings.DURABLE_MAX_DELIVERIES,
                                                      claim_expires_at="2000-01-01T00:00:00Z")
    assert workpool.reap(db="default") == 1
    return "failed"


def deadline(run, env):
    env.clock.advance(minutes=90)  # past the deadline, not the wait's timeout
    assert workpool.fire_timers(db="default") == 1
    claim = workpool.claim(worker="w", queues=None, db="default")
    assert claim.run_id == run.pk
    assert advance(claim) == "timed_out"
    return "timed_out"


def missing_code(run, env):
    env.settings.DURABLE_MISSING_CODE_GRACE_SECONDS = 0
    find, get = registry.find, registry.get

    def missing(name):
        raise durable.WorkflowNotFound(name)

    env.monkeypatch.setattr(registry, "find", lambda name: None if name == "tests.endings.kid" else find(name))
    env.monkeypatch.setattr(registry, "get", lambda name: missing(name) if name == "tests.endings.kid" else get(name))
    claim = _claim_advance(run.pk)
    assert advance(claim) == "failed"
    return "failed"


def subject_deleted(run, env):
    from django.contrib.contenttypes.models import ContentType
    from django.db.models.signals import post_delete

    ticket = Ticket.objects.create(title="printer")
    WorkflowRun.objects.filter(pk=run.pk).update(  # a run about the ticket
        subject_type_id=ContentType.objects.get_for_model(Ticket).pk, subject_id=str(ticket.pk))
    durable.cancel_runs_on_delete(Ticket, workflows=["tests.endings.kid"])
    try:
        ticket.delete()
    finally:
        post_delete.disconnect(sender=Ticket, dispatch_uid="durable-subject-testapp.Ticket")
    return "cancelled"


ENDERS = [worker_completes, worker_completes_in_a_batch, worker_fails, cancel, force_fail, poison, deadline, missing_code, subject_deleted]


class Ends:
    """The end signals sent for a workflow, and whether they were sent after commit."""

    def __init__(self, *workflows):
        self.sent = []
        self.workflows = workflows

    def receive(self, sender, run_id, workflow, **kwargs):
        self.sent.append((run_id, workflow, kwargs.get("status"), connection.in_atomic_block))

    def __enter__(self):
        for signal in (signals.run_completed, signals.run_failed, signals.run_cancelled):
            for workflow in self.workflows:
                signal.connect(self.receive, sender=registry.sender_of(workflow), weak=False)
        return self

    def __exit__(self, *exc):
        for signal in (signals.run_completed, signals.run_failed, signals.run_cancelled):
            for workflow in self.workflows:
                signal.disconnect(self.receive, sender=registry.sender_of(workflow))

    def of(self, run_id):
        return [sent for sent in self.sent if sent[0] == run_id]


class DoneListener:
    """A durable.wait()'s view on PostgreSQL: LISTEN on the channel a run's end is announced on."""

    def __init__(self):
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        self.conn = psycopg.connect(**params, autocommit=True)
        self.conn.execute("LISTEN durable_done")

    def heard(self, run_id, timeout=10.0) -> int:
        select.select([self.conn.fileno()], [], [], timeout)
        return sum(1 for n in self.conn.notifies(timeout=0.5) if n.payload == str(run_id))

    def close(self):
        self.conn.close()


def _waiting_family():
    """Start the parent, and so the kid and its two children; give the kid a branch not started yet."""
    top = durable.start(parent)
    drain()
    kid_run = WorkflowRun.objects.get(parent_id=top.pk)
    children = {run.detached: run for run in WorkflowRun.objects.filter(parent_id=kid_run.pk)}
    assert kid_run.status == "waiting" and {run.status for run in children.values()} == {"waiting"}
    assert set(Timer.objects.filter(run=kid_run, status="pending").values_list("kind", flat=True)) == {
        "deadline", "signal_timeout"}
    branch = WorkItem.objects.create(  # queued by a fan-out, not due yet
        kind=WorkItem.Kind.STEP, run_id=kid_run.pk, step_key="g:0", group="g", function="tests.testapp.f",
        input="{}", queue=kid_run.queue, available_at=dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    WorkflowRun.objects.filter(pk=kid_run.pk).update(awaited=True)  # as durable.wait() marks it
    return top, kid_run, children[False], children[True], branch


@pytest.fixture
def env(settings, monkeypatch):
    """What an ender may change: the settings, the engine's clock (frozen now), and attributes."""
    with clock() as frozen:
        yield types.SimpleNamespace(settings=settings, clock=frozen, monkeypatch=monkeypatch)


@pytest.mark.parametrize("ender", ENDERS, ids=lambda ender: ender.__name__)
def test_every_ending_drags_the_same_things_along(ender, env):
    top, run, attached, detached, branch = _waiting_family()
    listener = DoneListener() if ON_POSTGRES else None
    try:
        with Ends("tests.endings.kid") as ends:
            status = ender(run, env)
        heard = listener.heard(run.pk) if listener else None
    finally:
        if listener:
            listener.close()
    ended = WorkflowRun.objects.get(pk=run.pk)
    assert ended.status == status and ended.finished_at is not None and ended.waiting_on == ""
    assert (ended.result is not None) == (status == "completed")
    assert (ended.error is not None) == (status != "completed")
    # Its timers never fire, its branch never starts, its advance item is gone (one the reaper
    # failed for good stays, failed, with the reason).
    assert not Timer.objects.filter(run=run, status="pending").exists()
    assert WorkItem.objects.get(pk=branch.pk).status == "cancelled"
    advance_item = list(WorkItem.objects.filter(run=run, kind="advance").values_list("status", "last_error"))
    if ender is poison:
        assert [status for status, _ in advance_item] == ["failed"] and "lost" in advance_item[0][1], advance_item
    else:
        assert advance_item == [], advance_item
    # Its children: the attached one goes with an end other than completed; the detached one stays.
    assert WorkflowRun.objects.get(pk=attached.pk).status == ("waiting" if status == "completed" else "cancelled")
    assert WorkflowRun.objects.get(pk=detached.pk).status == "waiting"
    # Its parent is woken now (its advance is ready), and a wait on it told, on PostgreSQL.
    assert WorkItem.objects.get(run=top, kind="advance").status == "pending"
    if heard is not None:
        assert heard == 1
    # The end's signal: once, after commit.
    assert ends.of(run.pk) == [(run.pk, "tests.endings.kid", None if status in ("completed", "cancelled") else status,
                                False)]
    # A terminal status never changes, and a second ender changes nothing.
    finished_at = ended.finished_at
    if status == "cancelled":
        durable.cancel(run.pk)
    else:
        with pytest.raises(durable.RunFinished):
            durable.cancel(run.pk)
    with pytest.raises(durable.RunFinished):
        durable.force_fail(run.pk)
    again = WorkflowRun.objects.get(pk=run.pk)
    assert (again.status, again.finished_at) == (status, finished_at)
    # The parent, woken, learns how its child ended.
    drain()
    assert WorkflowRun.objects.get(pk=top.pk).get_result() == (
        {"kid": "done"} if status == "completed" else {"kid ended": status})


# -- a django.tasks task's run ends the same way ------------------------------------------------------


def _task_enders():
    def by_worker(result_id, env):
        drain()

    def by_worker_in_a_batch(result_id, env):
        (claim,) = workpool.claim_many(worker="w", queues=None, db="default", k=2)
        claim.batch = workpool.Batch()
        advance(claim)
        workpool.finish_runs(claim.batch.take())

    def by_cancel(result_id, env):
        durable.cancel(result_id)

    def by_force_fail(result_id, env):
        durable.force_fail(result_id)

    def by_poison(result_id, env):
        claim = workpool.claim(worker="w", queues=None, db="default")
        WorkItem.objects.filter(pk=claim.item_id).update(attempts=env.settings.DURABLE_MAX_DELIVERIES,
                                                          claim_expires_at="2000-01-01T00:00:00Z")
        assert workpool.reap(db="default") == 1

    return [(by_worker, "SUCCESSFUL"), (by_worker_in_a_batch, "SUCCESSFUL"), (by_cancel, "FAILED"), (by_force_fail, "FAILED"), (by_poison, "FAILED")]


@pytest.mark.parametrize("ender, expected", _task_enders(), ids=lambda value: getattr(value, "__name__", value))
def test_a_tasks_run_ends_with_task_finished_once(ender, expected, env):
    from tests.testapp.tasks import echo
    try:
        from django.tasks import TaskResultStatus
        from django.tasks.signals import task_finished
    except ImportError:
        from django_tasks import TaskResultStatus
        from django_tasks.signals import task_finished

    finished = []

    def receiver(sender, task_result, **kwargs):
        finished.append((task_result.id, task_result.status, connection.in_atomic_block))

    task_finished.connect(receiver)
    try:
        result = echo.enqueue(1)
        ender(uuid.UUID(result.id), env)
    finally:
        task_finished.disconnect(receiver)
    status = getattr(TaskResultStatus, expected)
    assert echo.get_result(result.id).status == status
    assert finished == [(result.id, status, False)]
