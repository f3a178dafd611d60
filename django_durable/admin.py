"""The operator dashboard in the Django admin: runs with their journal, work items and timers.

Everything here is read-only: status, lease and journal fields change only through the engine.
"""

from django.contrib import admin

from .models import Step, Timer, WorkflowRun, WorkItem


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class StepInline(admin.TabularInline):
    model = Step
    extra = 0
    can_delete = False
    fields = ["seq", "key", "kind", "name", "status", "attempts", "result", "error", "started_at", "finished_at"]
    readonly_fields = fields
    ordering = ["seq"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ReadOnlyAdmin):
    list_display = ["id", "workflow", "status", "waiting_on", "queue", "attempt", "created_at", "finished_at"]
    list_filter = ["status", "workflow", "queue"]
    search_fields = ["=id", "workflow", "=idempotency_key"]
    date_hierarchy = "created_at"
    show_full_result_count = False
    inlines = [StepInline]

    def has_delete_permission(self, request, obj=None):
        # Only finished runs may be deleted; a running one would lose its journal under a worker.
        if obj is not None and not obj.is_finished:
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # bulk delete would skip the finished-only rule
        return actions


@admin.register(WorkItem)
class WorkItemAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "run", "queue", "priority", "status", "attempts", "available_at", "claimed_by", "claim_expires_at"]
    list_filter = ["status", "kind", "queue"]
    list_select_related = ["run"]
    show_full_result_count = False


@admin.register(Timer)
class TimerAdmin(ReadOnlyAdmin):
    list_display = ["id", "kind", "run", "step_key", "fire_at", "status"]
    list_filter = ["status", "kind"]
    show_full_result_count = False
