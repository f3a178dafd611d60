"""The machinery: work items (with their claims), timers, workers and the audit trail; read-only,
except for releasing a stuck claim."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Count, Q
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html

from .. import services
from ..models import StoredEvent, Timer, Worker, WorkflowEvent, WorkItem
from . import display
from ..stats import live_workers_since
from .base import DurableAdmin, parse_uuid
from .filters import QueueFilter
from .runs import run_link


class RunSearch:
    """Search by run id (the whole UUID) without scanning the table."""

    search_fields = ["=run__id"]
    search_help_text = "A run id."

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        pk = parse_uuid(term)
        return (queryset.filter(run_id=pk) if pk else queryset.none()), False


class LeaseFilter(admin.SimpleListFilter):
    title = "lease"
    parameter_name = "lease"

    def lookups(self, request, model_admin):
        return [("expired", "Expired (stuck claim)"), ("held", "Held")]

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "expired":
            return queryset.filter(status=WorkItem.Status.PROCESSING, claim_expires_at__lt=now)
        if self.value() == "held":
            return queryset.filter(status=WorkItem.Status.PROCESSING, claim_expires_at__gte=now)
        return queryset


@admin.register(WorkItem)
class WorkItemAdmin(RunSearch, DurableAdmin):
    list_display = ["id", "kind", "run_link", "step_key", "queue", "priority", "status_badge", "delivery", "available",
                    "claimed_by", "lease", "error"]
    list_filter = ["status", "kind", QueueFilter, LeaseFilter]
    ordering = ["-id"]
    actions = ["release_claims"]
    readonly_fields = [f.name for f in WorkItem._meta.fields]

    def has_delete_permission(self, request, obj=None):
        return False  # the engine's state: a deleted item would strand its run

    def has_release_permission(self, request):
        return self.has_custom_permission(request, "release_workitem")

    @admin.display(description="run")
    def run_link(self, item):
        return run_link(item.run_id, self.admin_site.name)

    @admin.display(description="status", ordering="status")
    def status_badge(self, item):
        return display.status_badge(item.status)

    @admin.display(description="delivery", ordering="attempts")
    def delivery(self, item):
        return display.delivery(item)

    @admin.display(description="available", ordering="available_at")
    def available(self, item):
        return display.relative(item.available_at) if item.status == WorkItem.Status.PENDING else ""

    @admin.display(description="lease")
    def lease(self, item):
        if item.status != WorkItem.Status.PROCESSING or item.claim_expires_at is None:
            return ""
        text = display.relative(item.claim_expires_at)
        if item.claim_expires_at < timezone.now():
            return format_html('<span class="durable-badge durable-failed">expired {}</span>', text)
        return f"expires {text}"

    @admin.display(description="last error")
    def error(self, item):
        text = item.last_error
        return text if len(text) <= 80 else text[:79] + "…"

    @admin.action(description="Release the claims of selected items…", permissions=["release"])
    def release_claims(self, request, queryset):
        items = list(queryset.filter(status=WorkItem.Status.PROCESSING).order_by()[:1000])
        skipped = queryset.exclude(status=WorkItem.Status.PROCESSING).count()
        if "apply" not in request.POST:
            return TemplateResponse(request, "admin/django_durable/workitem/release.html", self.page_context(
                request, f"Release {len(items)} claim(s)", items=items, skipped=skipped,
                selected=[str(i.pk) for i in items], action_name=request.POST.get("action", ""),
            ))
        done = 0
        for item in items:
            if services.release_claim(item.pk, by=request.user.get_username()):
                done += 1
                self.log_change(request, item, f"Released the claim of {item.claimed_by}")
        skipped += len(items) - done
        self.message_user(request, f"Released {done} claim(s); {skipped} skipped (not claimed).",
                          messages.SUCCESS if done else messages.WARNING)
        return None


@admin.register(Timer)
class TimerAdmin(RunSearch, DurableAdmin):
    list_display = ["id", "kind", "run_link", "step_key", "fire_at", "due", "status"]
    list_filter = ["status", "kind"]
    ordering = ["-id"]
    readonly_fields = [f.name for f in Timer._meta.fields]

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="run")
    def run_link(self, timer):
        return run_link(timer.run_id, self.admin_site.name)

    @admin.display(description="due")
    def due(self, timer):
        return display.relative(timer.fire_at) if timer.status == Timer.Status.PENDING else ""


class WorkerStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("live", "Live"), ("stale", "Stale (no report lately)"), ("stopped", "Stopped")]

    def queryset(self, request, queryset):
        since = live_workers_since()
        if self.value() == "live":
            return queryset.filter(stopped_at__isnull=True, last_seen__gte=since)
        if self.value() == "stale":
            return queryset.filter(stopped_at__isnull=True, last_seen__lt=since)
        if self.value() == "stopped":
            return queryset.filter(stopped_at__isnull=False)
        return queryset


@admin.register(Worker)
class WorkerAdmin(DurableAdmin):
    list_display = ["name", "host", "pid", "serves", "state", "started", "seen", "processed", "current"]
    list_filter = [WorkerStateFilter]
    search_fields = ["name", "host"]
    ordering = ["-last_seen"]
    readonly_fields = [f.name for f in Worker._meta.fields]

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.stopped_at is None and obj.last_seen >= live_workers_since():
            return False  # a live worker would write its row again anyway
        return super().has_delete_permission(request, obj)

    @admin.display(description="queues")
    def serves(self, worker):
        return worker.queues or "all"

    @admin.display(description="state")
    def state(self, worker):
        if worker.stopped_at is not None:
            return display.status_badge("cancelled", "stopped")
        if worker.last_seen < live_workers_since():
            return display.status_badge("failed", "stale")
        return display.status_badge("completed", "live")

    @admin.display(description="started", ordering="started_at")
    def started(self, worker):
        return display.relative(worker.started_at)

    @admin.display(description="last seen", ordering="last_seen")
    def seen(self, worker):
        return display.relative(worker.last_seen)


class ActorFilter(admin.SimpleListFilter):
    title = "done by"
    parameter_name = "by"

    def lookups(self, request, model_admin):
        return [("people", "People"), ("code", "Code")]

    def queryset(self, request, queryset):
        if self.value() == "people":
            return queryset.exclude(actor="")
        if self.value() == "code":
            return queryset.filter(actor="")
        return queryset


@admin.register(WorkflowEvent)
class WorkflowEventAdmin(RunSearch, DurableAdmin):
    list_display = ["at", "run_link", "type", "who", "message"]
    list_filter = ["type", ActorFilter]
    ordering = ["-at", "-id"]
    date_hierarchy = "at"
    fields = ["run", "at", "type", "actor", "message"]
    readonly_fields = fields

    def has_delete_permission(self, request, obj=None):
        return False  # an audit trail is not edited; it goes when its run is deleted

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if term and parse_uuid(term) is None:
            return queryset.filter(Q(actor=term)), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="run")
    def run_link(self, event):
        return run_link(event.run_id, self.admin_site.name)

    @admin.display(description="by", ordering="actor")
    def who(self, event):
        return event.actor or "code"


@admin.register(StoredEvent)
class StoredEventAdmin(DurableAdmin):
    """Emitted events kept for DURABLE_EVENT_RETENTION, and how many runs took each; their payloads
    only for users who may see payloads."""

    search_fields = ["=name"]
    search_help_text = "An event's name."
    ordering = ["-id"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(taken_by=Count("deliveries"))

    def _payloads(self, request) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.view_payload_workflowrun")

    def get_list_display(self, request):
        return ["created_at", "name", *(["payload_text"] if self._payloads(request) else []), "taken"]

    def get_fields(self, request, obj=None):
        return self.get_list_display(request)

    def get_readonly_fields(self, request, obj=None):
        return self.get_list_display(request)

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.view_workflowrun")

    def has_delete_permission(self, request, obj=None):
        return False  # `durable prune` deletes them after the retention

    @admin.display(description="payload")
    def payload_text(self, event):
        return display.value_text(event.payload)[0]

    @admin.display(description="taken by runs", ordering="taken_by")
    def taken(self, event):
        return event.taken_by
