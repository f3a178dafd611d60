"""Signals and events: messages from outside that waiting runs take."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from .. import conf, serialization, workpool
from ..models import SignalMessage, WorkflowEvent
from ..ids import check_name
from ..workpool.messages import emit_event, stamp
from .locks import lock_unfinished
from ..ids import run_pk

__all__ = ["emit_event", "signal"]


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
    check_name(name, "signal")
    pk = run_pk(run_id)
    text = serialization.encode(payload, what="signal payload", max_bytes=conf.get("MAX_PAYLOAD_BYTES"), owner=pk)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        run = lock_unfinished(pk, db)
        message = SignalMessage(run_id=pk, name=name, payload=text, idempotency_key=idempotency_key, **stamp())
        if idempotency_key is None:
            message.save(using=db)
        else:
            SignalMessage.objects.using(db).bulk_create([message], ignore_conflicts=True)
            message = SignalMessage.objects.using(db).get(run_id=pk, idempotency_key=idempotency_key)
        workpool.wake([pk], db=db)
        if by is not None:
            shown = serialization.display(text) if len(text) <= 4000 else text[:4000] + "…"  # JSON, not its text
            WorkflowEvent.record(pk, WorkflowEvent.Type.SIGNAL_SENT, by=by, message=f"Signal {name!r}",
                                 data={"name": name, "payload": shown, "message": message.pk}, db=db)
    message.workflow = run.workflow  # for catalog.unawaited_signal(), which the API and the CLI ask
    return message


