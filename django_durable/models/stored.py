"""Payloads stored apart: the rows the payload store (payloads.py) keeps of the files it writes.

Below serialization (which stores a large payload apart), so it imports nothing above the models' base.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .base import DurableManager


class StoredPayload(models.Model):
    """A payload written to STORAGES["durable"] instead of its column (payloads.py): the prune
    deletes the file with its run. No foreign key: a run's input is stored before the run is."""

    run_id = models.UUIDField(db_index=True)
    name = models.CharField(max_length=255, unique=True)
    bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(db_default=Now())

    objects = DurableManager()

    class Meta:
        db_table = "durable_stored_payload"

    def __str__(self) -> str:
        return self.name
