"""Signals and events: messages from outside that waiting runs take."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import DurationField, Exists, OuterRef, Q, Subquery, Value

from .. import clock, conf, serialization, workpool
from ..models import SignalMessage, Step, StoredEvent, WorkflowRun
from .runs import _run_pk
from .locks import lock_unfinished


def _check_name(name, what: str) -> None:
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise ValueError(f"A {what} name must be a string of 1 to 200 characters, not {str(name)[:80]!r}.")


def signal(run_id, name: str, payload: Any = None, *, idempotency_key: str | None = None,
           by: str | None = None) -> SignalMessage:
    """Send the signal `name` with `payload` to a run; return the stored SignalMessage.

    The run takes it with ``ctx.wait_for_signal(name)``, now or later: signals wait in FIFO
    order. With an `idempotency_key`, sending again returns the first message and stores
    nothing. Raise WorkflowNotFound for an unknown run, RunFinished for a finished one (nothing
    is stored then), NotSerializable or PayloadTooLarge for a payload that cannot be stored.
    With `by` (who sent it by hand), the signal goes into the run's audit trail. A name the run's
    workflow never waits for is stored all the same (django_durable.catalog.unawaited_signal()
    says so).
    """
    _check_name(name, "signal")
    pk = _run_pk(run_id)
    text = serialization.encode(payload, what="signal payload", max_bytes=conf.get("MAX_PAYLOAD_BYTES"), owner=pk)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = lock_unfinished(pk, db)
        message = SignalMessage(run_id=pk, name=name, payload=text, idempotency_key=idempotency_key, **_stamp())
        if idempotency_key is None:
            message.save(using=db)
        else:
            SignalMessage.objects.using(db).bulk_create([message], ignore_conflicts=True)
            message = SignalMessage.objects.using(db).get(run_id=pk, idempotency_key=idempotency_key)
        workpool.wake([pk], db=db)
        if by is not None:
            from ..models import WorkflowEvent
            from . import audit

            shown = serialization.display(text) if len(text) <= 4000 else text[:4000] + "…"  # JSON, not its text
            audit.record(pk, WorkflowEvent.Type.SIGNAL_SENT, by=by, message=f"Signal {name!r}",
                         data={"name": name, "payload": shown, "message": message.pk}, db=db)
    message.workflow = run.workflow  # for catalog.unawaited_signal(), which the API and the CLI ask
    return message


def emit_event(name: str, payload: Any = None) -> int:
    """Deliver the event `name` to every run now waiting for it whose match fits; return how many.

    A wait matches when each of its `match` fields (a dotted path into the payload) equals the
    payload's value. The event is also kept for DURABLE_EVENT_RETENTION: a run that begins to
    wait for it later (since its `since`, by default since the run was created) takes it then.
    """
    _check_name(name, "event")
    text = serialization.encode(payload, what="event payload", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
    value = serialization.decode(text)  # compare as the waiting run would see it
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        stored = None
        if _event_retention() > 0:
            stored = StoredEvent(name=name, payload=text, **_stamp())
            stored.save(using=db)
        waits = (
            Step.objects.using(db)
            .filter(kind=Step.Kind.EVENT, status=Step.Status.WAITING, name=name)
            # A wait whose timeout passed has lost to it (first come wins), even if no worker
            # has replayed the run yet to record that.
            .filter(Q(deadline_at__isnull=True) | Q(deadline_at__gt=clock.db_now()))
            .exclude(run__status__in=WorkflowRun.TERMINAL)
            .values_list("run_id", "key", "match")
        )
        targets = [(run_id, key) for run_id, key, match in waits if _matches(serialization.decode(match) or {}, value)]
        SignalMessage.objects.using(db).bulk_create(
            (SignalMessage(run_id=run_id, kind=SignalMessage.Kind.EVENT, name=name, payload=text, target_key=key,
                           event=stored, **_stamp())
             for run_id, key in targets),
            ignore_conflicts=True,  # a run that already took this event
        )
        if targets:
            workpool.wake([run_id for run_id, _ in targets], db=db)
    return len(targets)


def take_stored_event(run_id, key: str, name: str, match: dict, since, db: str) -> tuple[int, str] | None:
    """Give the wait `key` of run `run_id` the oldest kept event `name` emitted at or after `since`
    (None: when the run was created) whose fields fit `match`, that this run has not taken yet.

    Return (the message now delivered to the wait, its payload), or None. The delivery is a
    message to the run like any event's, so the wait consumes it with its journal entry; a run
    takes each event once (durable_signal_one_event_per_run), however it reaches it.
    """
    if _event_retention() <= 0:
        return None
    kept = clock.db_now() - Value(dt.timedelta(seconds=_event_retention()), output_field=DurationField())
    events = StoredEvent.objects.using(db).filter(name=name, created_at__gte=kept).exclude(
        Exists(SignalMessage.objects.using(db).filter(run_id=run_id, event=OuterRef("pk"))))
    if since is None:
        events = events.filter(created_at__gte=Subquery(WorkflowRun.objects.using(db).filter(pk=run_id)
                                                        .values("created_at")[:1]))
    else:
        events = events.filter(created_at__gte=since)
    for event_id, text in events.order_by("id").values_list("id", "payload").iterator(chunk_size=100):
        if not _matches(match, serialization.decode(text)):
            continue
        SignalMessage.objects.using(db).bulk_create(
            [SignalMessage(run_id=run_id, kind=SignalMessage.Kind.EVENT, name=name, payload=text, target_key=key,
                           event_id=event_id, **_stamp())],
            ignore_conflicts=True)
        delivered = SignalMessage.objects.using(db).filter(run_id=run_id, event_id=event_id).first()
        # Delivered to another wait of this run meanwhile (by emit_event): that wait takes it.
        if delivered is not None and delivered.target_key == key and delivered.consumed_at is None:
            return delivered.pk, text
    return None


def _event_retention() -> float:
    return clock.seconds(conf.get("EVENT_RETENTION"), "DURABLE_EVENT_RETENTION")


def _stamp() -> dict:
    """A message's arrival time: the database's clock (its column default), or the frozen test clock."""
    return {"created_at": clock.now()} if clock.is_frozen() else {}


def _matches(match: dict, payload: Any) -> bool:
    missing = object()
    for path, expected in match.items():
        value = payload
        for part in path.split("."):
            value = value.get(part, missing) if isinstance(value, dict) else missing
        if value is missing or value != expected:
            return False
    return True


