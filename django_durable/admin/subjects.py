"""A model's runs on its own admin page: an inline of the runs started for the row
(``durable.start(..., subject=obj)``) and a mixin that adds it, with actions to start workflows
for the selected rows.

    from django_durable.admin import DurableSubjectAdmin

    @admin.register(Order)
    class OrderAdmin(DurableSubjectAdmin, admin.ModelAdmin):
        durable_start = {"orders.fulfil": lambda order: {"order_id": order.pk}}
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.contenttypes.admin import GenericTabularInline
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from .. import registry, services
from ..exceptions import DurableError
from ..models import Step, WorkflowRun
from ..services.control import RESUMABLE
from .base import base_actions
from .display import status_badge

RECENT_STEPS = 12


class DurableRunsInline(GenericTabularInline):
    """The runs started for this row, newest first: status, what each waits for, its progress and
    its latest steps; each links to its page in the admin, where an operator acts on it."""

    model = WorkflowRun
    ct_field = "subject_type"
    ct_fk_field = "subject_id"
    verbose_name = "workflow run"
    verbose_name_plural = "Workflow runs"
    extra = 0
    max_num = 0
    can_delete = False
    fields = readonly_fields = ("run", "workflow", "state", "timeline", "created_at", "finished_at", "act")
    ordering = ("-created_at",)

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).defer("input", "result", "error")

    @admin.display(description="run")
    def run(self, obj):
        url = reverse(f"{self.admin_site.name}:django_durable_workflowrun_change", args=[obj.pk])
        return format_html('<a href="{}"><code>{}</code></a>', url, obj.short_id)

    @admin.display(description="status")
    def state(self, obj):
        waiting = obj.current_waiting_on() if not obj.is_finished else ""
        progress = obj.progress()
        told = f"{progress['done']} of {progress['total']}" if progress and progress.get("total") else ""
        return format_html('{} <span class="durable-muted">{}</span>', status_badge(obj.status),
                           " · ".join(part for part in (waiting, told) if part))

    @admin.display(description="")
    def act(self, obj):
        """Cancel or retry the run from here (the run's own action pages, behind their permissions)."""
        actions = []
        if not obj.is_finished:
            actions.append(("cancel", "Cancel"))
        if obj.status in RESUMABLE:
            actions.append(("retry", "Retry"))
        return format_html_join(" ", '<a class="button" href="{}">{}</a>', (
            (reverse(f"{self.admin_site.name}:django_durable_workflowrun_action", args=[obj.pk, name]), title)
            for name, title in actions))

    @admin.display(description="latest steps")
    def timeline(self, obj):
        steps = list(Step.objects.filter(run=obj).exclude(kind__in=["note", "log", "progress"])
                     .order_by("-seq").values_list("key", "kind", "status")[:RECENT_STEPS])[::-1]
        shown = [(key, Step.shown_status(status, kind, obj.is_finished)) for key, kind, status in steps]
        return format_html_join(" ", '<span class="durable-badge durable-{}" title="{}">{}</span>',
                                (("cancelled" if status == Step.STOPPED else status, status, key[:24])
                                 for key, status in shown))


class DurableSubjectAdmin:
    """Mix into a ModelAdmin: its change page lists the row's runs (DurableRunsInline), and
    `durable_start` ({workflow: a function of the row that gives the run's keyword arguments})
    becomes list actions that start each workflow for the selected rows, as their subject."""

    durable_start: dict = {}

    def get_inlines(self, request, obj):
        inlines = list(super().get_inlines(request, obj))
        if obj is not None and DurableRunsInline not in inlines:
            inlines.append(DurableRunsInline)
        return inlines

    def get_actions(self, request, action_location=None):
        actions = base_actions(self, DurableSubjectAdmin, request, action_location)
        # Starting acts on the rows selected: offered on the list only (6.1 also asks for a change form's).
        if (getattr(action_location, "value", "CHANGE_LIST") != "CHANGE_LIST"
                or not request.user.has_perm("django_durable.start_workflowrun")):
            return actions
        for workflow, arguments in self.durable_start.items():
            name = f"durable_start_{registry.get(workflow).name}"
            actions[name] = (self._starter(workflow, arguments), name, f"Start {workflow} for the selected %(verbose_name_plural)s")
        return actions

    @staticmethod
    def _starter(workflow, arguments):
        def start(modeladmin, request, queryset):
            started, refused = 0, []
            for obj in queryset:
                try:
                    services.start_run(workflow, [], arguments(obj), subject=obj, by=request.user.get_username())
                    started += 1
                except DurableError as exc:
                    refused.append(f"{obj}: {exc}")
            if started:
                messages.success(request, f"Started {workflow} for {started} row(s).")
            for line in refused:
                messages.warning(request, line)

        return start
