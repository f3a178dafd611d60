"""Messages to runs: an event delivered to the runs waiting for it, a kept event taken by a wait
that began later. Below the engine (``ctx.emit()`` delivers in its step's transaction, a wait takes a
kept event) and the services (``durable.emit_event()``, ``durable.signal()``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction
from django.db.models import DurationField, Exists, OuterRef, Q, Subquery, Value

from ..ids import check_name
from .. import clock, conf, serialization
from ..models import SignalMessage, Step, StoredEvent, WorkflowRun
from .wakeups import wake


def emit_event(name: str, payload: Any = None) -> int:
    """Deliver the event `name` to every run now waiting for it whose match fits; return how many.

    A wait matches when each of its `match` fields (a dotted path into the payload) equals the
    payload's value. The event is also kept for DURABLE_EVENT_RETENTION: a run that begins to
    wait for it later (since its `since`, by default since the run was created) takes it then.
    """
    check_name(name, "event")
    text = serialization.encode(payload, what="event payload", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
    value = serialization.decode(text)  # compare as the waiting run would see it
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        stored = None
        if _event_retention() > 0:
            stored = StoredEvent(name=name, payload=text, **stamp())
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
                           event=stored, **stamp())
             for run_id, key in targets),
            ignore_conflicts=True,  # a run that already took this event
        )
        if targets:
            wake([run_id for run_id, _ in targets], db=db)
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
                           event_id=event_id, **stamp())],
            ignore_conflicts=True)
        delivered = SignalMessage.objects.using(db).filter(run_id=run_id, event_id=event_id).first()
        # Delivered to another wait of this run meanwhile (by emit_event): that wait takes it.
        if delivered is not None and delivered.target_key == key and delivered.consumed_at is None:
            return delivered.pk, text
    return None


def _event_retention() -> float:
    return clock.seconds(conf.get("EVENT_RETENTION"), "DURABLE_EVENT_RETENTION")


def stamp() -> dict:
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


