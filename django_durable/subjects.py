"""What becomes of a subject's runs when the row is deleted (durable.start(..., subject=row)).

By default nothing: the runs stay, with their history, and ``run.subject`` is None. A model whose
unfinished runs make no sense without their row says so once, at start-up (an AppConfig.ready()):

    durable.cancel_runs_on_delete(Order)                          # every workflow's runs
    durable.cancel_runs_on_delete(Order, workflows=["orders.fulfil"])
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_delete

logger = logging.getLogger("django_durable")


def cancel_runs_on_delete(model, *, workflows=None, reason: str = "Its subject was deleted.") -> None:
    """Cancel the unfinished runs of a row of `model` (of `workflows`, or all) once its deletion commits.

    A deletion that rolls back cancels nothing. Calling it again for the same model replaces the
    earlier choice.
    """
    from . import registry

    names = None if workflows is None else {registry.get(workflow).name for workflow in workflows}

    def cancel_its_runs(sender, instance, using, **kwargs):
        from .models import WorkflowRun
        from .services import cancel, runs_for

        runs = runs_for(instance).exclude(status__in=WorkflowRun.TERMINAL)
        if names is not None:
            runs = runs.filter(workflow__in=names)
        pks = list(runs.values_list("pk", flat=True))
        label = f"{model._meta.label} {instance.pk}"

        def after_commit():
            for pk in pks:
                try:
                    cancel(pk, reason, by=f"deletion of {label}")
                except Exception as exc:  # noqa: BLE001 - ended meanwhile, or gone: the others still go
                    logger.info("Run %s of deleted %s was not cancelled: %s", pk, label, exc)

        if pks:
            transaction.on_commit(after_commit, using=using)

    post_delete.connect(cancel_its_runs, sender=model, weak=False, dispatch_uid=f"durable-subject-{model._meta.label}")


def forget_deleted_rows(sender, instance, **kwargs) -> None:
    """A deleted user or content type leaves no id behind in the durable tables (they may be on
    another database, so this is a receiver, not a foreign key's SET_NULL)."""
    from django.contrib.contenttypes.models import ContentType

    from .models import ApprovalDecision, WorkflowRun

    if isinstance(instance, ContentType):
        WorkflowRun.objects.filter(subject_type_id=instance.pk).update(subject_type=None)
    else:
        ApprovalDecision.objects.filter(user_id=instance.pk).update(user=None)


def connect_deletions() -> None:
    from django.conf import settings

    post_delete.connect(forget_deleted_rows, sender=settings.AUTH_USER_MODEL, dispatch_uid="durable-user-deleted")
    post_delete.connect(forget_deleted_rows, sender="contenttypes.ContentType", dispatch_uid="durable-type-deleted")
