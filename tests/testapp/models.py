"""Tables the tests' workflows write to."""

from django.db import models


class Payment(models.Model):
    """Written by an atomic step; must exist exactly once per run."""

    run_id = models.UUIDField()
    amount = models.IntegerField()

    class Meta:
        permissions = [("approve_refund", "Can approve refunds")]  # wait_for_approval's approvers


class Ticket(models.Model):
    """A row runs are started for (durable.start(..., subject=ticket)); its admin page lists them."""

    title = models.CharField(max_length=100)

    def __str__(self):
        return f"Ticket {self.pk}: {self.title}"
