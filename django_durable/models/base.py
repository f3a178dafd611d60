"""What every durable model shares: its manager, which reads and writes DURABLE_DATABASE."""

from __future__ import annotations

from django.db import models

from .. import conf


class DurableManager(models.Manager):
    """Every durable model's manager: its querysets use DURABLE_DATABASE unless told otherwise
    (.using(), db_manager()), so the admin, the API and project code reading the durable tables
    find them on their own database, with or without django_durable.routers.DurableRouter."""

    def get_queryset(self):
        return self._queryset_class(model=self.model, using=self._db or conf.get("DATABASE"), hints=self._hints)
