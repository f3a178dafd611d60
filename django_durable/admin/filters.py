"""The run list's filters: none of them reads the table to list its choices."""

from __future__ import annotations

from django.contrib import admin

from .. import registry
from ..models import WorkflowRun

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


class WaitingForFilter(admin.SimpleListFilter):
    title = "waiting for"
    parameter_name = "waiting_for"

    def lookups(self, request, model_admin):
        labels = {"sleep": "A sleep", "retry": "A retry's back-off", "signal": "A signal", "event": "An event",
                  "children": "Branches or a child", "start": "Its delayed start",
                  "code": "A worker with its code, or a fix of it", "approval": "An approval",
                  "operator": "An operator (paused)"}
        return [(kind, labels[kind]) for kind in WorkflowRun.WAITING_FOR]

    def queryset(self, request, queryset):
        if self.value() in WorkflowRun.WAITING_FOR:
            return queryset.waiting_for(self.value())
        return queryset


class StuckFilter(admin.SimpleListFilter):
    title = "stuck"
    parameter_name = "stuck"

    def lookups(self, request, model_admin):
        return [("any", "Stuck"), ("lease", "Worker's lease expired"), ("idle", "Nothing will advance it")]

    def queryset(self, request, queryset):
        if self.value() == "any":
            return queryset.stuck()
        if self.value() == "lease":
            return queryset.stuck(nothing_pending=False)
        if self.value() == "idle":
            return queryset.stuck(lease_expired=False)
        return queryset
