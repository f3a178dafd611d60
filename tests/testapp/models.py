"""Tables the tests' workflows write to."""

from django.db import models


class Payment(models.Model):
    """Written by an atomic step; must exist exactly once per run."""

    run_id = models.UUIDField()
    amount = models.IntegerField()

    class Meta:
        permissions = [("approve_refund", "Can approve refunds")]  # wait_for_approval's approvers
