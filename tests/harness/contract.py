"""T46's driver: every transition of the workpool run through one implementation, the whole rows after.

An implementation is a way the workpool's face reaches a database: ``sqlite``; ``postgres`` one
claim and one end at a time; ``sqlite-batch`` and ``postgres-batch`` (claim_many(), and a completion written by
finish_runs()); ``partitioned`` (PostgreSQL with the runs and the journal partitioned: run as a
process of its own on a database made for it, see main()). Each starts from the same states (a
run with an earlier failed attempt, its item stamped missing-code and at a fair turn, a pending
timer, a pending branch, an unread signal, and, in one of them, a cancel already requested) and
snapshots every row of the run afterwards: the run, its work items, timers, journal and
messages, with times named by what they are (now, the turn, ...) and ids by whose they are. A
test (tests/test_contract.py) compares each implementation's snapshots with one expected file,
so every implementation writes the same rows.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
import uuid

from django.db import transaction

STATES = ("earlier_failure", "cancel_requested")
TRANSITIONS = ("claim", "record_steps", "complete", "fail", "wait", "requeue", "retry_run", "unclaim", "pause",
               "branch_claim", "finish_branch", "finish_branch_fail_fast", "retry_branch", "pause_branch")
IMPLEMENTATIONS = ("sqlite", "sqlite-batch", "postgres", "postgres-batch", "partitioned")
BATCHES = ("sqlite-batch", "postgres-batch")  # claim_many(), and a completion written by finish_runs()

_WORKFLOW = "tests.contract.flow"
# A fair queue (its items have turns, fairness.py): DURABLE_QUEUES while run_all() runs.
QUEUE = "contract"
QUEUES = {QUEUE: {"fairness": True}}
_FIRST_ERROR = '{"type": "StepFailed", "message": "the first attempt failed"}'
_CANCEL_ERROR = '{"type": "Cancelled", "message": "asked to"}'


class _Times:
    """The times a state and its transitions use, each with the name a snapshot shows for it."""

    def __init__(self, now: dt.datetime):
        self.now = now
        self.named = {
            now: "now", now - dt.timedelta(minutes=1): "turn", now - dt.timedelta(minutes=5): "missing_since",
            now - dt.timedelta(seconds=30): "cancel_requested_at", now + dt.timedelta(hours=1): "in an hour",
            now + dt.timedelta(days=1): "tomorrow", now + dt.timedelta(seconds=10): "retry_at",
            now - dt.timedelta(seconds=2): "step started", now - dt.timedelta(seconds=1): "step finished",
            now - dt.timedelta(minutes=10): "before",
            dt.datetime(9999, 12, 31, tzinfo=dt.timezone.utc): "held until resumed",
        }

    def at(self, name: str) -> dt.datetime:
        return next(when for when, label in self.named.items() if label == name)

    def name(self, value: dt.datetime) -> str:
        # Microseconds apart at most: a database may keep less than Python's precision.
        for when, label in self.named.items():
            if abs((value - when).total_seconds()) < 0.001:
                return label
        return "another time"


# The run's columns a claim writes (WorkflowRun.RUNNING_COLUMNS), as every state starts them: one
# taken in a batch leaves them so until its turn ends (times by their names, as a snapshot shows them).
UNCLAIMED = {"status": "pending", "started_at": None, "updated_at": "before",
             "waiting_on": "retry of tests.contract.flow", "last_worker": "", "last_claimed_at": None}


def _state(name: str, times: _Times):
    """Make the starting state `name`; return its run."""
    from django_durable import partitioning
    from django_durable.models import SignalMessage, Step, Timer, WorkflowRun, WorkItem

    run = WorkflowRun.objects.create(
        workflow=_WORKFLOW, status=UNCLAIMED["status"], input='{"args": [], "kwargs": {}}', attempt=2, max_attempts=3,
        error=_FIRST_ERROR, queue=QUEUE, waiting_on=UNCLAIMED["waiting_on"], concurrency_key="tenant:1")
    WorkflowRun.objects.filter(pk=run.pk).update(updated_at=times.at("before"))
    if name == "cancel_requested":
        WorkflowRun.objects.filter(pk=run.pk).update(cancel_requested_at=times.at("cancel_requested_at"),
                                                     error=_CANCEL_ERROR)
    turn = times.at("turn")
    WorkItem.objects.create(kind="advance", run=run, queue=QUEUE, status="pending", available_at=turn, turn=turn,
                            missing_since=times.at("missing_since"), last_error="a worker lacked its code")
    WorkItem.objects.create(kind="step", run=run, step_key="fan:0", group="fan", function="tests.contract.branch",
                            input="{}", queue=QUEUE, status="pending", available_at=times.at("tomorrow"))
    WorkItem.objects.create(kind="step", run=run, step_key="fan:1", group="fan", function="tests.contract.branch",
                            input="{}", queue=QUEUE, status="pending", available_at=times.at("tomorrow"))
    Timer.objects.create(kind="sleep", run=run, step_key="nap", fire_at=times.at("in an hour"))
    # The timeout of the wait the message answers ("b" consumes it): ended with the consumption.
    Timer.objects.create(kind="signal_timeout", run=run, step_key="b", fire_at=times.at("in an hour"))
    partition = partitioning.entry_fields(run.pk, "default")  # where the journal is partitioned
    Step.objects.create(**partition, run=run, key="a", seq=1, kind="step", name="tests.contract.a", status="completed",
                        result="1", attempts=1, started_at=times.at("step started"),
                        finished_at=times.at("step finished"))
    Step.objects.create(**partition, run=run, key="fan", seq=2, kind="parallel", name="", status="waiting", attempts=1,
                        remaining=2, started_at=times.at("step started"))
    SignalMessage.objects.create(run=run, kind="signal", name="go", payload='"x"')
    return run


def _record(key: str, seq: int, times: _Times, *, status="completed", result="2", error=None, consumes=None,
            retry_at=None):
    from django_durable.journal import StepRecord

    return StepRecord(key, seq, "step", f"tests.contract.{key}", status, result, error, 1, times.at("step started"),
                      times.at("step finished"), retry_at=retry_at, consumes=consumes)


def _claim(implementation: str):
    from django_durable import workpool

    if implementation in BATCHES:
        claims = workpool.claim_many(worker="w", queues=None, db="default", k=2)
        assert len(claims) == 1, claims
        claims[0].batch = workpool.Batch()
        return claims[0]
    return workpool.claim(worker="w", queues=None, db="default")


def _transition(name: str, implementation: str, run, times: _Times) -> str:
    """Run transition `name` on `run`'s rows through `implementation`; return what it answered."""
    from django_durable import workpool
    from django_durable.models import SignalMessage, WorkItem

    if name.startswith(("branch", "finish_branch", "retry_branch", "pause_branch")):
        WorkItem.objects.filter(run=run, kind="advance").update(status="completed")  # the run waits for its group
        WorkItem.objects.filter(run=run, step_key="fan:0").update(available_at=times.at("turn"))
    claim = _claim(implementation)
    assert claim is not None and claim.run_id == run.pk, claim
    if name in ("claim", "branch_claim"):
        return "claimed"
    signal = SignalMessage.objects.get(run=run).pk
    if name == "record_steps":
        workpool.record_steps(claim, [_record("b", 3, times, consumes=signal)])
        return "recorded"
    if name == "complete":
        final = workpool.finish_run(claim, status="completed", result='"ok"', error=None,
                                    records=[_record("b", 3, times, consumes=signal)])
        if claim.batch is not None:
            ((_, final),) = workpool.finish_runs(claim.batch.take())
        return str(final)
    if name == "fail":
        return str(workpool.finish_run(claim, status="failed", result=None, error='{"type": "Boom"}',
                                       records=[_record("b", 3, times, status="failed", result=None,
                                                        error='{"type": "Boom"}')]))
    if name == "wait":
        return str(workpool.release(claim, run_status="waiting", waiting_on="signal go",
                                    records=[_record("b", 3, times)],
                                    timers=[("signal_timeout", "signal:go:0", times.at("in an hour"))],
                                    items=[("fan:2", "fan", "tests.contract.branch", "{}")]))
    if name == "pause":  # a step's attempts ran out under a pausing policy (engine/replay.py _pause)
        return str(workpool.release(claim, run_status="paused", waiting_on="an operator: step 'b' failed 1 time (Boom)",
                                    records=[_record("b", 3, times, status="paused", result=None,
                                                     error='{"type": "Boom"}')]))
    if name == "requeue":
        return str(workpool.release(claim, run_status="pending"))
    if name == "retry_run":
        return str(workpool.retry_run(claim, retry_at=times.at("retry_at"), error='{"type": "Again"}', records=[],
                                      waiting_on="retry of tests.contract.flow"))
    if name == "unclaim":
        return str(workpool.unclaim([claim]))
    if name == "finish_branch":
        return str(workpool.finish_branch(claim, _record("fan:0", 4, times), failed=False, fail_fast=False))
    if name == "finish_branch_fail_fast":
        return str(workpool.finish_branch(claim, _record("fan:0", 4, times, status="failed", result=None,
                                                         error='{"type": "Boom"}'), failed=True, fail_fast=True))
    if name == "retry_branch":
        return str(workpool.retry_branch(claim, _record("fan:0", 4, times, status="retrying", result=None,
                                                        error='{"type": "Boom"}', retry_at=times.at("retry_at")),
                                         retry_at=times.at("retry_at")))
    if name == "pause_branch":  # a branch's attempts ran out under a pausing policy (engine/branches.py)
        from django_durable.engine.branches import HELD_UNTIL

        return str(workpool.retry_branch(claim, _record("fan:0", 4, times, status="paused", result=None,
                                                        error='{"type": "Boom"}'), retry_at=HELD_UNTIL))
    raise ValueError(f"No transition {name!r}.")


# Columns a snapshot leaves out: the rows' own ids and the times the database stamps itself.
_LEFT_OUT = {"id", "created_at", "id_time", "run_created_at"}


def _value(value, run_id, times: _Times, tokens: dict):
    if isinstance(value, dt.datetime):
        return times.name(value)
    if isinstance(value, uuid.UUID) or (isinstance(value, str) and len(value) == 36 and value.count("-") == 4):
        if str(value) == str(run_id):
            return "the run"
        return tokens.setdefault(str(value), f"uuid {len(tokens) + 1}")
    return value


def snapshot(run, times: _Times) -> dict:
    """Every row of `run`, named: the run, its work items, timers, journal entries and messages."""
    from django_durable.models import SignalMessage, Step, Timer, WorkflowRun, WorkItem

    tokens: dict = {}

    def rows(queryset, order):
        named = []
        for row in queryset.order_by(*order).values():
            named.append({column: _value(value, run.pk, times, tokens) for column, value in sorted(row.items())
                          if column not in _LEFT_OUT})
        return named

    return {
        "run": rows(WorkflowRun.objects.filter(pk=run.pk), ["id"]),
        "work_items": rows(WorkItem.objects.filter(run_id=run.pk), ["kind", "step_key"]),
        "timers": rows(Timer.objects.filter(run_id=run.pk), ["kind", "step_key"]),
        "journal": rows(Step.objects.filter(run_id=run.pk), ["seq"]),
        "messages": rows(SignalMessage.objects.filter(run_id=run.pk), ["name"]),
    }


def run_all(implementation: str) -> dict:
    """{state: {transition: {"answer", "rows"}}} of `implementation`, each from a fresh state."""
    from django.test import override_settings

    found: dict = {}
    with override_settings(DURABLE_QUEUES=QUEUES):
        for state in STATES:
            for transition in TRANSITIONS:
                found.setdefault(state, {})[transition] = _one(state, transition, implementation)
    return found


def _one(state: str, transition: str, implementation: str) -> dict:
    """The answer and the rows of `transition` from a fresh `state` through `implementation`."""
    from django_durable.models import WorkflowRun
    from django_durable.testing import clock

    with clock() as frozen:
        times = _Times(frozen.now)
        with transaction.atomic():
            run = _state(state, times)
        try:
            answer = _transition(transition, implementation, run, times)
            return {"answer": answer, "rows": snapshot(run, times)}
        finally:
            WorkflowRun.objects.filter(pk=run.pk).delete()


def main() -> None:
    """The partitioned implementation, in a database of its own (tests/test_contract.py makes it):
    with ``convert``, migrate and partition the journal and the runs; then, in a process started
    after that (a process that knew the plain tables writes without the partition keys), print
    run_all()'s snapshots as JSON."""
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from django_durable import partitioning

    if sys.argv[1:] == ["convert"]:
        call_command("migrate", verbosity=0)
        partitioning.convert(connection.alias)  # the journal first: a month of runs is dropped with its entries
        partitioning.runs.convert(connection.alias)
        return
    assert partitioning.layout() is not None and partitioning.runs.layout() is not None
    json.dump(run_all("partitioned"), sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
