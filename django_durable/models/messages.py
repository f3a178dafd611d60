"""Messages to runs: signals and delivered events, and the events kept for runs that wait later."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .. import serialization
from .base import DurableManager


class SignalMessage(models.Model):
    """A signal sent to a run, or an event delivered to a run that waited for it.

    Signals wait in FIFO order until the run consumes them; an event is delivered to one wait of
    the run (`target_key` names it): one already waiting when it is emitted, or one that began
    later and took the kept event (`event`). Consuming one is recorded in the same statement as
    the journal entry that returns it, so none is consumed twice or lost.
    """

    class Kind(models.TextChoices):
        SIGNAL = "signal", "Signal"
        EVENT = "event", "Event"
        APPROVAL = "approval", "Approval decided"

    run = models.ForeignKey("WorkflowRun", on_delete=models.CASCADE, related_name="signals")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.SIGNAL)
    name = models.CharField(max_length=200)
    payload = models.TextField(default="null", help_text="JSON.")
    target_key = models.CharField(max_length=255, blank=True, default="")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    event = models.ForeignKey(
        "StoredEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries",
        help_text="The emitted event this message delivers (one delivery per run and event).",
    )
    created_at = models.DateTimeField(db_default=Now())
    consumed_at = models.DateTimeField(null=True, blank=True)
    consumed_by = models.CharField(max_length=255, blank=True, default="", help_text="The wait's key.")

    objects = DurableManager()

    class Meta:
        db_table = "durable_signal"
        ordering = ["run", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="durable_signal_idempotency_key",
            ),
            # A run takes an emitted event once, whichever way it arrives (delivered to a wait
            # already there, or found by a wait that began later).
            models.UniqueConstraint(fields=["run", "event"], condition=Q(event__isnull=False),
                                    name="durable_signal_one_event_per_run"),
        ]
        indexes = [
            # A claim reads the run's unconsumed messages.
            models.Index(fields=["run", "id"], condition=Q(consumed_at__isnull=True), name="durable_signal_unconsumed"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} to {self.run_id}"

    def get_payload(self):
        return serialization.decode(self.payload)


class StoredEvent(models.Model):
    """An event emitted with ``durable.emit_event()`` (or ``ctx.emit()``), kept for
    DURABLE_EVENT_RETENTION, so that a run that begins waiting for it a moment later still takes it."""

    name = models.CharField(max_length=200)
    payload = models.TextField(default="null", help_text="JSON.")
    created_at = models.DateTimeField(db_default=Now())

    objects = DurableManager()

    class Meta:
        db_table = "durable_event"
        ordering = ["id"]
        indexes = [models.Index(fields=["name", "created_at"], name="durable_event_name")]
        verbose_name = "emitted event"

    def __str__(self) -> str:
        return f"event {self.name} at {self.created_at:%Y-%m-%d %H:%M:%S}"

    def get_payload(self):
        return serialization.decode(self.payload)
