"""The run list's filters: none of them reads the table to list its choices."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from .. import registry
from ..models import Step, Timer, WorkflowRun, WorkItem

Status = WorkflowRun.Status


class WorkflowFilter(admin.SimpleListFilter):
    title = "workflow"
    parameter_name = "workflow"

    def lookups(self, request, model_admin):
        return [(name, name) for name in registry.names()]

    def queryset(self, request, queryset):
        return queryset.filter(workflow=self.value()) if self.value() else queryset


class KindFilter(admin.SimpleListFilter):
    """Workflows, or django.tasks tasks (runs of the tasks this process knows)."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [("workflow", "Workflows"), ("task", "Tasks")]

    def queryset(self, request, queryset):
        return queryset.of_kind(self.value()) if self.value() in ("workflow", "task") else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        queues = {"default"} | {d.queue for d in registry.definitions()}
        return [(name, name) for name in sorted(queues)]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


class ErrorFilter(admin.SimpleListFilter):
    title = "error"
    parameter_name = "has_error"

    def lookups(self, request, model_admin):
        return [("yes", "Has an error"), ("no", "No error")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(error__isnull=False)
        if self.value() == "no":
            return queryset.filter(error__isnull=True)
        return queryset


def stuck_runs(queryset, *, lease_expired=True, nothing_pending=True):
    """Unfinished runs whose worker's lease expired, or that nothing will ever advance.

    Nothing will advance a run that has no queued or claimed work item, no pending timer, no
    wait for a signal or event (those come from outside), and no unfinished child.
    """
    now = timezone.now()
    run = OuterRef("pk")
    expired = Exists(WorkItem.objects.filter(run=run, status=WorkItem.Status.PROCESSING, claim_expires_at__lt=now))
    idle = (
        ~Exists(WorkItem.objects.filter(run=run, status__in=[WorkItem.Status.PENDING, WorkItem.Status.PROCESSING]))
        & ~Exists(Timer.objects.filter(run=run, status=Timer.Status.PENDING))
        & ~Exists(Step.objects.filter(run=run, status=Step.Status.WAITING, kind__in=[Step.Kind.SIGNAL, Step.Kind.EVENT]))
        & ~Exists(WorkflowRun.objects.filter(parent=run).exclude(status__in=WorkflowRun.TERMINAL))
    )
    condition = Q()
    if lease_expired and nothing_pending:
        condition = expired | idle
    elif lease_expired:
        condition = expired
    else:
        condition = idle
    # Named statuses rather than "not terminal": the planner then starts from the few unfinished
    # runs on the status index instead of walking the whole table.
    unfinished = [status for status in Status.values if status not in WorkflowRun.TERMINAL]
    return queryset.filter(status__in=unfinished).filter(condition)


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request, model_admin):
        return [("any", "Stuck"), ("lease", "Worker's lease expired"), ("idle", "Nothing will advance it")]

    def queryset(self, request, queryset):
        if self.value() == "any":
            return stuck_runs(queryset)
        if self.value() == "lease":
            return stuck_runs(queryset, nothing_pending=False)
        if self.value() == "idle":
            return stuck_runs(queryset, lease_expired=False)
        return queryset
