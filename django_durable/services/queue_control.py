"""Queues steered at runtime: pause and resume a queue, change its limits, clear the changes.

Each change is a row of QueueControl. Every claim statement of every worker leaves out the items
of a paused queue, so a pause holds from each worker's next claim on, and the worker finishes
what it already holds; limits set here override DURABLE_QUEUES for that queue until cleared, on
every worker within a second (queues.refresh()). The rows outlive worker restarts and deploys. Each change is recorded in QueueChange with who made it,
and wakes idle workers (a resumed queue is claimed from at once).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from .. import conf, queues, workpool
from ..models import QueueChange, QueueControl

UNSET: Any = object()
MAX_LIMIT = 1_000_000


def _name(queue: str) -> str:
    if not isinstance(queue, str) or not 0 < len(queue) <= 100:
        raise ValueError(f"A queue name is a string of 1 to 100 characters, not {queue!r}.")
    return queue


def _changed(queue: str, change: dict, by: str | None, **fields) -> QueueControl:
    """Write the queue's control row and its audit entry in one transaction; wake idle workers."""
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        control, _ = QueueControl.objects.using(db).select_for_update().get_or_create(name=queue)
        for field, value in fields.items():
            setattr(control, field, value)
        control.changed_by = by or ""
        control.save(using=db)
        QueueChange.objects.using(db).create(queue=queue, actor=by or "", change=change)
        workpool.notify(db)
    control.refresh_from_db(using=db)
    queues.refresh(db, force=True)  # in force in this process at once
    return control


def pause_queue(queue: str, *, reason: str = "", by: str | None = None) -> QueueControl:
    """Stop every worker claiming from `queue` (from its next claim on); what they hold runs on."""
    return _changed(_name(queue), {"paused": True, **({"reason": reason} if reason else {})}, by,
                    paused=True, reason=(reason or "")[:500])


def resume_queue(queue: str, *, by: str | None = None) -> QueueControl:
    """Let the workers claim from `queue` again."""
    return _changed(_name(queue), {"paused": False}, by, paused=False, reason="")


def limit_of(text: str, name: str) -> int | None:
    """A concurrency limit as a form or the command line gives it: a positive whole number, or None
    for "" and "none" (no override). ValueError naming `name` for anything else."""
    text = text.strip()
    if text in ("", "none"):
        return None
    if not text.isdecimal() or not 0 < int(text) <= MAX_LIMIT:
        raise ValueError(f"The {name.replace('_', ' ')} is a positive whole number up to {MAX_LIMIT:,} "
                         f"(or none), not {text[:20]!r}.")
    return int(text)


def set_queue_limits(queue: str, *, concurrency=UNSET, key_concurrency=UNSET, rate_limit=UNSET,
                     by: str | None = None) -> QueueControl:
    """Override `queue`'s limits of DURABLE_QUEUES (those given; None drops that override):
    `concurrency` and `key_concurrency` (positive integers), `rate_limit` ("10/s", "100/min")."""
    queue = _name(queue)
    fields: dict[str, Any] = {}
    for name, value in (("concurrency", concurrency), ("key_concurrency", key_concurrency)):
        if value is UNSET:
            continue
        if value is not None and (type(value) is not int or not 0 < value <= MAX_LIMIT):
            raise ValueError(f"A queue's {name} is a positive integer up to {MAX_LIMIT:,}, not {value!r}.")
        fields[name] = value
    if rate_limit is not UNSET:
        if rate_limit not in (None, ""):
            queues.parse_rate(rate_limit)  # ValueError saying how it is written
        fields["rate_limit"] = rate_limit or ""
    if not fields:
        raise ValueError("Give concurrency, key_concurrency or rate_limit (None drops an override).")
    return _changed(queue, {"limits": {name: value for name, value in fields.items()}}, by, **fields)


def clear_queue(queue: str, *, by: str | None = None) -> bool:
    """Drop every runtime change of `queue`: not paused, its limits DURABLE_QUEUES' again. Return
    whether it had any."""
    queue = _name(queue)
    db = conf.get("DATABASE")
    with transaction.atomic(using=db):
        deleted, _ = QueueControl.objects.using(db).filter(name=queue).delete()
        if deleted:
            QueueChange.objects.using(db).create(queue=queue, actor=by or "", change={"cleared": True})
            workpool.notify(db)
    queues.refresh(db, force=True)
    return bool(deleted)


def queue_states() -> list[dict]:
    """Every queue that has work, limits or a runtime change: whether it is paused, its limits as
    DURABLE_QUEUES sets them, the overrides, and the limits in force now."""
    from django.db.models import Count

    from ..models import WorkItem

    db = conf.get("DATABASE")
    controls = {control.name: control for control in QueueControl.objects.using(db).all()}
    queues.refresh(db, rows=[(c.name, c.concurrency, c.key_concurrency, c.rate_limit) for c in controls.values()])
    setting = queues.parse(conf.get("QUEUES") or {})
    in_force = queues.configured()
    ready = dict(WorkItem.objects.using(db).filter(status=WorkItem.Status.PENDING).order_by()
                 .values_list("queue").annotate(n=Count("id")))
    names = sorted(set(controls) | set(setting) | set(in_force) | set(ready))
    states = []
    for name in names:
        control = controls.get(name)
        configured = setting.get(name)
        overrides = {}
        if control is not None:
            for field in ("concurrency", "key_concurrency"):
                if getattr(control, field) is not None:
                    overrides[field] = getattr(control, field)
            if control.rate_limit:
                overrides["rate_limit"] = control.rate_limit
        states.append({
            "name": name, "paused": bool(control and control.paused), "reason": control.reason if control else "",
            "pending": ready.get(name, 0),
            "configured": configured.describe() if configured else "no limits",
            "overrides": overrides,
            "in_force": in_force[name].describe() if name in in_force else "no limits",
            "changed_at": control.changed_at if control else None,
            "changed_by": control.changed_by if control else "",
        })
    return states
