"""A run as a file, and back: ``manage.py durable export RUN_ID`` writes one; a test loads it with
``durable.testing.load_run()`` and replays it against the code under test, so a run that went
wrong in production becomes a regression test.

The file holds the run's input, outcome and journal, and its signals and events, exactly as
stored (their JSON texts unchanged): it may hold personal data, so treat it as you would a
database dump.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

from django.db import transaction

from . import conf, partitioning
from .models import SignalMessage, Step, WorkflowRun
from .workpool.runs import advance_item

FORMAT = "django-durable-run/1"

_RUN_FIELDS = ("workflow", "status", "waiting_on", "input", "result", "error", "attempt", "max_attempts", "queue",
               "priority", "idempotency_key", "concurrency_key", "created_at", "started_at", "finished_at",
               "deadline_at")
_STEP_FIELDS = ("key", "seq", "kind", "name", "status", "result", "error", "attempts", "started_at", "finished_at",
                "deadline_at", "retry_at", "match", "remaining", "fingerprint")
_MESSAGE_FIELDS = ("kind", "name", "payload", "target_key", "idempotency_key", "created_at", "consumed_at",
                   "consumed_by")


def export_run(run_id) -> dict:
    """The run `run_id` as JSON-ready data (see this module); raise WorkflowNotFound."""
    from .ids import run_pk
    from .exceptions import WorkflowNotFound

    db = conf.get("DATABASE")
    pk = run_pk(run_id)
    run = WorkflowRun.objects.using(db).filter(pk=pk).first()
    if run is None:
        raise WorkflowNotFound(f"No workflow run has the id {pk}.")
    return {
        "format": FORMAT,
        "id": str(run.pk),
        "run": {field: _plain(getattr(run, field)) for field in _RUN_FIELDS},
        "journal": [{field: _plain(getattr(step, field)) for field in _STEP_FIELDS}
                    for step in Step.objects.using(db).filter(run_id=pk).order_by("seq")],
        "messages": [{field: _plain(getattr(message, field)) for field in _MESSAGE_FIELDS}
                     for message in SignalMessage.objects.using(db).filter(run_id=pk).order_by("id")],
    }


def load_run(data: dict | str, *, run_id=None) -> WorkflowRun:
    """Store the run of an exported file (its data, or the path of the file) and return it.

    It gets its id back (or `run_id`), its journal, signals and events. Under another id, its
    steps' fingerprints are dropped (arguments that hold the run's id differ there), so only
    their functions are checked on replay. An unfinished run is
    ready for a worker (``durable.testing.drain()``), which replays its journal against the code
    installed now and carries on; a finished one stays finished (``durable.retry_run()`` sends a
    failed one on from its last checkpoint, as in production). ValueError for a file of another
    format.
    """
    if isinstance(data, str):
        with open(data, encoding="utf-8") as file:
            data = json.load(file)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"Not an exported run (format {FORMAT!r}).")
    db = conf.get("DATABASE")
    pk = uuid.UUID(str(run_id or data["id"]))
    fields = {field: _typed(field, value) for field, value in data["run"].items() if field in _RUN_FIELDS}
    unfinished = fields.get("status") not in WorkflowRun.TERMINAL
    if unfinished and fields.get("status") in (WorkflowRun.Status.RUNNING, WorkflowRun.Status.BLOCKED):
        fields["status"] = WorkflowRun.Status.PENDING  # no worker holds it here; replayed by the code under test
    with transaction.atomic(using=db):
        run = WorkflowRun(id=pk, **fields)
        run.save(using=db, force_insert=True)
        fields_kept = _STEP_FIELDS if str(pk) == str(data.get("id")) else set(_STEP_FIELDS) - {"fingerprint"}
        key = partitioning.entry_fields(pk, db)
        Step.objects.using(db).bulk_create(
            Step(run_id=pk, **key, **{field: _typed(field, value) for field, value in entry.items() if field in fields_kept})
            for entry in data.get("journal", []))
        SignalMessage.objects.using(db).bulk_create(
            SignalMessage(run_id=pk, **{field: _typed(field, value) for field, value in message.items()
                                        if field in _MESSAGE_FIELDS})
            for message in data.get("messages", []))
        if unfinished:  # an ended run has no advance item (a retry makes one)
            advance_item(run).save(using=db, force_insert=True)
    return WorkflowRun.objects.using(db).get(pk=pk)


_TIMES = {"created_at", "started_at", "finished_at", "deadline_at", "retry_at", "consumed_at"}


def _plain(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def _typed(field: str, value: Any) -> Any:
    if field in _TIMES and isinstance(value, str):
        return dt.datetime.fromisoformat(value)
    return value
