"""The runs: a list that stays fast on a large table, a detail page with the journal and its
timeline, and the operator actions, each behind its own permission and through the services."""

from __future__ import annotations

import re
from collections import Counter

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Q
from django.db.models.functions import Substr
from django.http import Http404, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.http import urlencode
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import catalog, conf, registry, serialization, services
from ..exceptions import DurableError, InvalidArguments
from ..models import SignalMessage, Step, Timer, WorkflowEvent, WorkflowRun, WorkItem
from ..payloads import reference as stored_reference
from ..payloads import shown as stored_shown
from ..services.control import RESUMABLE
from ..workpool import evidence
from . import display, forms, graph, timeline
from .actions import ACTIONS, BULK, BULK_LIMIT, RunAction, reason_of
from .base import DurableAdmin, base_actions, parse_uuid, without_jit
from .filters import (
    ErrorFilter,
    KindFilter,
    QueueFilter,
    StuckFilter,
    WaitingForFilter,
    WorkflowFilter,
)

Status = WorkflowRun.Status
STEPS_PER_PAGE = 200


class RunChangeList(ChangeList):
    def get_queryset(self, request, *args, **kwargs):
        # The big columns stay in the database; the list shows the start of the error only.
        return (
            super().get_queryset(request, *args, **kwargs)
            .defer("input", "result", "error")
            .annotate(error_head=Substr("error", 1, 600))
        )

    def get_results(self, request):
        super().get_results(request)
        self.result_list = list(self.result_list)
        decorate(self.result_list, payloads=self.model_admin.can_see_payloads(request))


def decorate(runs: list[WorkflowRun], *, payloads: bool) -> None:
    """Load the page's current steps and next wake-ups in two queries (not two per row)."""
    pks = [run.pk for run in runs]
    current: dict = {}
    open_steps = (
        Step.objects.filter(run_id__in=pks).exclude(status=Step.Status.COMPLETED).exclude(kind=Step.Kind.PROGRESS)
        .order_by("run_id", "seq").values_list("run_id", "key", "status")
    )
    for run_id, key, status in open_steps:
        current[run_id] = (key, status)  # the latest open entry of each run
    wakes = {}
    for run_id, at, kind in (Timer.objects.filter(run_id__in=pks, status=Timer.Status.PENDING)
                             .order_by("-fire_at").values_list("run_id", "fire_at", "kind")):
        wakes[run_id] = (at, kind)  # the earliest pending timer of each run, and what it is for
    for run in runs:
        run.current_step = current.get(run.pk)
        run.next_wake = wakes.get(run.pk)
        run.show_error_message = payloads


# What the run list's "now" says of a run's next timer: a timeout is not a wake-up the run waits for.
_WAKE_WORDS = {Timer.Kind.SIGNAL_TIMEOUT: "times out", Timer.Kind.DEADLINE: "deadline", Timer.Kind.RETRY: "retries"}


@admin.register(WorkflowRun)
class WorkflowRunAdmin(DurableAdmin):
    # Fits a 1,440-pixel window beside the admin's navigation: what it is doing now is one column
    # (the current step, what it waits for, when it wakes), the queue is a filter, and when it was
    # created and how long it took share one.
    list_display = ["short_id", "workflow_name", "status_badge", "now_doing", "created", "last_error"]
    list_display_links = ["short_id"]
    # A date filter, not a date hierarchy: the hierarchy lists the distinct days, months or years
    # of the whole table (a scan of every run), the filter is a range on an index.
    list_filter = ["status", KindFilter, WorkflowFilter, QueueFilter, ErrorFilter, WaitingForFilter, StuckFilter,
                   ("created_at", admin.DateFieldListFilter)]
    search_fields = ["workflow"]  # shows the box; get_search_results decides
    search_help_text = "A run id (or its last 8 digits), a workflow name, or an idempotency key."
    ordering = ["-created_at"]
    list_per_page = 50
    actions = ["cancel_runs", "retry_runs", "force_fail_runs", "retry_rollback_runs", "wake_runs", "recover_runs",
               "duplicate_runs", "delete_finished_runs"]

    # -- permissions --------------------------------------------------------------------------

    def has_delete_permission(self, request, obj=None):
        # Only finished runs: deleting one a worker is advancing would pull its journal away.
        if obj is not None and not obj.is_finished:
            return False
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs, request):
        """A run's journal, items, timers, signals and trail go with it: no permission of their own is
        needed, and they are counted rather than listed (a run may have thousands of steps)."""
        runs = [run for run in objs if run.is_finished]
        pks = [run.pk for run in runs]
        related = [Step, WorkItem, Timer, SignalMessage, WorkflowEvent]
        counts = {model._meta.verbose_name_plural: model.objects.filter(run_id__in=pks).count() for model in related}
        counts = {name: count for name, count in counts.items() if count}
        counts[self.opts.verbose_name_plural] = len(runs)
        return [str(run) for run in runs], counts, set(), []

    def can_see_payloads(self, request) -> bool:
        return self.has_custom_permission(request, "view_payload_workflowrun")

    def get_actions(self, request, action_location=None):
        actions = base_actions(self, WorkflowRunAdmin, request, action_location)
        actions.pop("delete_selected", None)  # it would not keep to finished runs; delete_finished_runs does
        return actions

    def get_changelist(self, request, **kwargs):
        return RunChangeList

    # -- the list -----------------------------------------------------------------------------

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        pk = parse_uuid(term)
        if pk is not None:
            return queryset.filter(pk=pk), False
        if re.fullmatch(r"[0-9a-fA-F]{8,12}", term):  # the end of a run's id (the short id the list shows)
            return queryset.filter(_id_ends_with(queryset.db, term.lower())), False
        return queryset.filter(Q(workflow=term) | Q(idempotency_key=term)), False

    @admin.display(description="workflow", ordering="workflow")
    def workflow_name(self, run):
        """The name, breakable after each dot and underscore: a long one must not widen the list past the window."""
        return format_html('<span class="durable-name">{}</span>', display.breakable(run.workflow))

    @admin.display(description="run", ordering="id")
    def short_id(self, run):
        return format_html('<code title="{}">{}</code>', run.pk, display.short_id(run.pk))

    @admin.display(description="status", ordering="status")
    def status_badge(self, run):
        label = run.status.replace("_", " ")
        if run.cancel_requested_at and not run.is_finished:
            label += " (cancelling)"
        badge = display.status_badge(run.status, label)
        if run.max_attempts > 1 or run.attempt > 1:
            return format_html('{} <span class="durable-muted" title="attempt">{}/{}</span>', badge, run.attempt,
                               run.max_attempts)
        return badge

    @admin.display(description="now")
    def now_doing(self, run):
        """The current step, what the run waits for (without its time: that is the wake-up), when it wakes."""
        if run.is_finished:
            return ""
        parts = []
        waiting = run.waiting_on.split(" until ")[0].split(" at 20")[0]
        current = getattr(run, "current_step", None)
        if waiting:
            parts.append(format_html("{}", waiting if len(waiting) <= 48 else waiting[:47] + "…"))
        elif current:
            key, status = current
            parts.append(format_html('<code>{}</code> <span class="durable-muted">{}</span>',
                                     key if len(key) <= 32 else key[:31] + "…", status))
        wake = getattr(run, "next_wake", None)
        if wake is not None:
            when, kind = wake
            parts.append(format_html('<span class="durable-muted" title="{}">{} {}</span>',
                                     when.isoformat(sep=" ", timespec="seconds"), _WAKE_WORDS.get(kind, "wakes"),
                                     display.relative(when)))
        return format_html_join(mark_safe("<br>"), "{}", ((part,) for part in parts))

    @admin.display(description="created")
    def created(self, run):
        """When it was created (sort by the run column: ids are time-ordered) and how long it has taken."""
        took = "" if run.started_at is None else display.duration(display.between(run.started_at, run.finished_at))
        return format_html('<span title="{}">{}</span>{}', run.created_at.isoformat(sep=" ", timespec="seconds"),
                           display.relative(run.created_at),
                           format_html('<br><span class="durable-muted">took {}</span>', took) if took else "")

    @admin.display(description="last error")
    def last_error(self, run):
        head = getattr(run, "error_head", None)
        if not head:
            return ""
        # The message may hold data from the run's input: only the error's type without the permission.
        return display.error_summary(head, with_message=getattr(run, "show_error_message", False), limit=90)

    def changelist_view(self, request, extra_context=None):
        extra = {
            "can_start": self.has_custom_permission(request, "start_workflowrun"),
            "repair_query": urlencode({param: value for param, value in request.GET.items()
                                       if param in self.LIST_TO_REPAIR}),
            "overview_url": reverse(f"{self.admin_site.name}:django_durable_overview_changelist"),
            **(extra_context or {}),
        }
        if request.method != "GET":  # (a bulk action: its runs each in a transaction of their own)
            return super().changelist_view(request, extra)
        with without_jit(conf.get("DATABASE")):
            response = super().changelist_view(request, extra)
            return response.render() if hasattr(response, "render") else response

    # -- bulk actions -------------------------------------------------------------------------

    def _bulk(self, request, queryset, name: str):
        action = ACTIONS[name]
        needs_form = action.form not in (forms.NoForm, forms.WakeForm)
        form = action.form(request.POST if "apply" in request.POST else None)
        runs = list(queryset.only("pk", "workflow", "status").order_by()[: BULK_LIMIT + 1])
        over = len(runs) > BULK_LIMIT
        runs = runs[:BULK_LIMIT]
        if (needs_form or action.destructive) and not ("apply" in request.POST and form.is_valid()):
            return TemplateResponse(request, "admin/django_durable/workflowrun/action.html", self.page_context(
                request, f"{action.title}: {len(runs)} run(s)", action=action, form=form, runs=runs[:20],
                count=len(runs), more=len(runs) - 20, bulk=True, selected=[str(r.pk) for r in runs], over=over,
                action_name=request.POST.get("action", ""),
            ))
        data = form.cleaned_data if form.is_bound and form.is_valid() else {}
        by = request.user.get_username()
        done, reasons = 0, Counter()
        for run in runs:
            try:
                what = action.perform(run, data, by)
            except DurableError as exc:
                reasons[reason_of(exc)] += 1
                continue
            done += 1
            self.log_change(request, run, what)
        skipped = sum(reasons.values())
        text = f"{BULK[name]} {done} run(s); {skipped} skipped"
        if reasons:
            text += " (" + "; ".join(f"{count} × {why}" for why, count in reasons.most_common(3)) + ")"
        if over:
            text += f". Only the first {BULK_LIMIT} selected runs were handled; run the action again for the rest"
        self.message_user(request, text + ".", messages.SUCCESS if done else messages.WARNING)
        return None

    @admin.action(description="Cancel selected runs…", permissions=["cancel"])
    def cancel_runs(self, request, queryset):
        return self._bulk(request, queryset, "cancel")

    @admin.action(description="Retry selected runs from their last checkpoint…", permissions=["retry"])
    def retry_runs(self, request, queryset):
        return self._bulk(request, queryset, "retry")

    @admin.action(description="Force selected runs to fail…", permissions=["forcefail"])
    def force_fail_runs(self, request, queryset):
        return self._bulk(request, queryset, "force-fail")

    @admin.action(description="Retry the rollback of selected runs…", permissions=["retryrollback"])
    def retry_rollback_runs(self, request, queryset):
        return self._bulk(request, queryset, "retry-rollback")

    @admin.action(description="Wake selected runs now (sleeps and back-offs)", permissions=["wake"])
    def wake_runs(self, request, queryset):
        return self._bulk(request, queryset, "wake")

    @admin.action(description="Recover selected stuck runs (give their advance back)", permissions=["retry"])
    def recover_runs(self, request, queryset):
        return self._bulk(request, queryset, "recover")

    @admin.action(description="Duplicate selected runs", permissions=["start"])
    def duplicate_runs(self, request, queryset):
        return self._bulk(request, queryset, "duplicate")

    @admin.action(description="Delete selected finished runs…", permissions=["delete"])
    def delete_finished_runs(self, request, queryset):
        finished = queryset.filter(status__in=WorkflowRun.TERMINAL)
        runs = list(finished.only("pk", "workflow", "status").order_by()[:BULK_LIMIT])
        skipped = queryset.exclude(status__in=WorkflowRun.TERMINAL).count()
        if "apply" not in request.POST:
            return TemplateResponse(request, "admin/django_durable/workflowrun/action.html", self.page_context(
                request, f"Delete {len(runs)} finished run(s)", action=RunAction(
                    "delete", "Delete", "delete_workflowrun", forms.NoForm, None, destructive=True,
                    explain="Their journal, timers, signals and audit trail are deleted with them. "
                            f"{skipped} unfinished run(s) among those selected are kept."),
                form=forms.NoForm(), runs=runs[:20], count=len(runs), more=len(runs) - 20, bulk=True,
                selected=[str(r.pk) for r in runs], action_name=request.POST.get("action", ""),
            ))
        doomed = WorkflowRun.objects.filter(pk__in=[r.pk for r in runs], status__in=WorkflowRun.TERMINAL)
        self.log_deletions(request, doomed)
        doomed.delete()
        self.message_user(request, f"Deleted {len(runs)} run(s); {skipped} skipped (unfinished).", messages.SUCCESS)
        return None

    def has_cancel_permission(self, request):
        return self.has_custom_permission(request, "cancel_workflowrun")

    def has_retry_permission(self, request):
        return self.has_custom_permission(request, "retry_workflowrun")

    def has_forcefail_permission(self, request):
        return self.has_custom_permission(request, "forcefail_workflowrun")

    def has_retryrollback_permission(self, request):
        return self.has_custom_permission(request, "retryrollback_workflowrun")

    def has_wake_permission(self, request):
        return self.has_custom_permission(request, "wake_workflowrun")

    def has_start_permission(self, request):
        return self.has_custom_permission(request, "start_workflowrun")

    # -- pages of one run ---------------------------------------------------------------------

    def get_urls(self):
        wrap = self.admin_site.admin_view
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("start/", wrap(self.start_view), name=f"{name}_start"),
            path("repair/", wrap(self.repair_view), name=f"{name}_repair"),
            path("<path:object_id>/do/<slug:action>/", wrap(self.action_view), name=f"{name}_action"),
            path("<path:object_id>/graph/", wrap(self.graph_view), name=f"{name}_graph"),
            path("<path:object_id>/events/", wrap(self.events_view), name=f"{name}_events"),
            *super().get_urls(),
        ]

    def get_run(self, object_id) -> WorkflowRun:
        pk = parse_uuid(object_id)
        run = WorkflowRun.objects.filter(pk=pk).first() if pk is not None else None
        if run is None:
            raise Http404("No workflow run has this id.")
        return run

    def change_view(self, request, object_id, form_url="", extra_context=None):
        return self.detail_view(request, self.viewed_run(request, object_id))

    def viewed_run(self, request, object_id) -> WorkflowRun:
        run = self.get_run(object_id)
        if not self.has_view_permission(request, run):
            raise PermissionDenied
        return run

    def graph_view(self, request, object_id):
        """The run's graph as it is now: the run page swaps it in when the run's events say it changed."""
        run = self.viewed_run(request, object_id)
        response = HttpResponse(self._graph(run), content_type="image/svg+xml")
        response["Cache-Control"] = "no-store"
        return response

    def events_view(self, request, object_id):
        """The run's live events, server-sent (services/streams.py), without values: what tells
        the run page to draw its graph again."""
        from django.core.handlers.asgi import ASGIRequest

        from .. import conf
        from ..services import streams

        run = self.viewed_run(request, object_id)
        try:
            after = max(0, int(request.headers.get("Last-Event-ID") or 0))
        except ValueError:
            after = 0
        follow = streams.aevents if isinstance(request, ASGIRequest) else streams.events
        response = StreamingHttpResponse(follow(run.pk, payloads=False, after=after,
                                                max_seconds=float(conf.get("STREAM_MAX_SECONDS"))),
                                         content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response

    def _graph(self, run: WorkflowRun, **read):
        site = self.admin_site.name
        return graph.of_run(run, run_url=lambda pk: reverse(f"{site}:django_durable_workflowrun_change", args=[pk]),
                            **read)

    def detail_view(self, request, run: WorkflowRun):
        payloads = self.can_see_payloads(request)
        full = request.GET.get("full", "")
        steps_all = Step.objects.filter(run=run).order_by("seq")
        page = Paginator(steps_all, STEPS_PER_PAGE).get_page(request.GET.get("steps"))
        steps = list(page.object_list)
        items = list(WorkItem.objects.filter(run=run).order_by("id")[:201])
        branch_keys = {item.step_key for item in items if item.kind == WorkItem.Kind.STEP}
        for item in items:
            item.delivery = display.delivery(item)
        now = timezone.now()
        for step in steps:
            step.took = display.duration(display.between(step.started_at, step.finished_at)) if step.started_at else ""
            step.result_text, step.result_long = display.value_text(step.result) if payloads else ("", False)
            stored = stored_reference(step.result) if payloads else None
            step.result_stored = stored_shown(stored)["stored"] if stored else None
            step.error_text = display.error_summary(step.error, with_message=payloads, limit=200)
            if step.kind == Step.Kind.PROGRESS:  # what the run said of itself, last set at started_at
                step.took, step.progress = "", display.progress_text(step.result)
                step.result_text, step.result_stored = "", None  # shown as progress, not as its JSON
            step.failed_now = step.status in (Step.Status.FAILED, Step.Status.RETRYING, Step.Status.PAUSED)
            # In a finished run nothing waits or runs any more: a step left so is shown stopped, and
            # only a failed step may be skipped (the run then goes again from there).
            step.stopped = Step.shown_status(step.status, step.kind, run.is_finished) == Step.STOPPED
            said = step.kind in (Step.Kind.LOG, Step.Kind.PROGRESS)  # nothing to skip or edit
            step.can_skip = not said and step.kind != Step.Kind.PARALLEL and (
                step.status == Step.Status.FAILED if run.is_finished else step.status != Step.Status.COMPLETED)
            step.can_edit = not said and step.status == Step.Status.COMPLETED and step.kind not in (
                Step.Kind.SLEEP, Step.Kind.PARALLEL)
            step.can_fork = step.key not in branch_keys
        error = run.get_error() if payloads and run.error else None
        paused = self._paused(run, payloads) if run.status == Status.PAUSED else None
        buttons = self._buttons(request, run)
        agent = self._agent(run, payloads)
        context = self.page_context(
            request, f"{run.workflow} {display.short_id(run.pk)}",
            run=run, original=run, payloads=payloads,
            status=display.status_badge(run.status),
            facts=self._facts(run, now),
            input=self._payload(run.input, "input", full) if payloads else None,
            result=self._payload(run.result, "result", full) if payloads and run.result is not None else None,
            error=error, error_summary=display.error_summary(run.error, with_message=payloads, limit=300)
            if run.is_finished else "", paused=paused,
            attempt_errors=[dict(entry, short_type=entry["type"].rpartition(".")[2])
                            for entry in evidence.history(run, db=run._state.db)] if payloads else [],
            agent=agent,
            steps=steps, steps_page=page, steps_total=page.paginator.count,
            # (drawn from the rows the page read, when it read them all)
            graph=self._graph(run, steps=steps if page.number == 1 and not page.has_next() else None,
                              items=items if len(items) <= 200 else None),
            timeline=timeline.render(run, steps, branch_keys=branch_keys, now=now, total=page.paginator.count)
            if steps or run.started_at else None,
            timers=list(Timer.objects.filter(run=run).order_by("-fire_at")[:100]),
            signals=self._signals(run, payloads),
            children=list(WorkflowRun.objects.filter(parent=run).defer("input", "result", "error")
                          .order_by("created_at")[:100]),
            items=items[:200],
            events=self._history(run, payloads),
            buttons=buttons,
            can_wake=self.has_custom_permission(request, "wake_workflowrun") and not run.is_finished,
            can_skip=self.has_custom_permission(request, "skipstep_workflowrun") and run.status != Status.COMPLETED,
            can_edit=self.has_custom_permission(request, "editstep_workflowrun"),
            can_fork=any(button["name"] == "fork" for button in buttons),
            can_delete=self.has_delete_permission(request, run),
            now=now,
        )
        return TemplateResponse(request, "admin/django_durable/workflowrun/detail.html", context)

    def _agent(self, run: WorkflowRun, payloads: bool) -> dict | None:
        """An agent's run as a conversation (contrib.agent_runs), when the run has one: its
        messages, tool calls and approvals (with the payload permission), and its usage."""
        from ..contrib import agent_runs

        found = agent_runs.of_run(run)
        if found is None:
            return None
        turns, usage, cut = found
        return {"turns": turns if payloads else [], "usage": usage, "cut": cut}

    def _facts(self, run: WorkflowRun, now):
        def when(moment):
            if moment is None:
                return ""
            return format_html('{} <span class="durable-muted">({})</span>',
                               moment.isoformat(sep=" ", timespec="milliseconds"), display.relative(moment, now))

        rows = [
            ("Run id", format_html("<code>{}</code>", run.pk)),
            ("Workflow", run.workflow if registry.find(run.workflow) else f"{run.workflow} (not registered here)"),
            ("Status", display.status_badge(run.status)),
        ]
        waiting_on = run.current_waiting_on()
        if waiting_on:
            rows.append(("Waiting on", waiting_on))
        rows += [
            ("Attempt", f"{run.attempt} of {run.max_attempts}"),
            ("Queue / priority", f"{run.queue} / {run.priority}"
             + (f" / concurrency key {run.concurrency_key}" if run.concurrency_key else "")),
            ("Created", when(run.created_at)),
        ]
        if run.scheduled_at:
            rows.append(("Scheduled for", when(run.scheduled_at)))
        rows += [("Started", when(run.started_at)), ("Finished", when(run.finished_at))]
        if run.started_at:
            rows.append(("Duration", display.duration(display.between(run.started_at, run.finished_at))))
        if run.deadline_at:
            rows.append(("Deadline", when(run.deadline_at)))
        if run.cancel_requested_at:
            rows.append(("Cancel requested", when(run.cancel_requested_at)))
        if run.idempotency_key:
            rows.append(("Idempotency key", run.idempotency_key))
        if (run.subject_lock or "").startswith("singleton:"):
            rows.append(("Singleton key", run.subject_lock.partition(":")[2]))
        if run.parent_id:
            rows.append(("Parent run", format_html('<a href="{}">{}</a>', self._url(run.parent_id), run.parent_id)))
        if run.forked_from:
            rows.append(("Forked from", format_html('<a href="{}">{}</a> at step <code>{}</code>',
                                                    self._url(run.forked_from), run.forked_from, run.forked_at_step)))
        forks = list(WorkflowRun.objects.filter(forked_from=run.pk).order_by("created_at")
                     .values_list("pk", "forked_at_step", "status")[:20])
        if forks:
            rows.append(("Forks", format_html_join(", ", '<a href="{}">{}</a> at <code>{}</code> ({})', (
                (self._url(pk), display.short_id(pk), step, status) for pk, step, status in forks))))
        return display.definition_list(rows)

    def _payload(self, text, name: str, full: str):
        stored = stored_reference(text)
        if stored is not None:  # a link and its size, never the body
            return {"name": name, "stored": stored_shown(stored)["stored"]}
        pretty, cut = display.pretty_json(text, limit=None if full == name else display.TRUNCATE_CHARS)
        return {"text": pretty, "cut": cut, "name": name}

    def _signals(self, run, payloads: bool):
        rows = list(SignalMessage.objects.filter(run=run).order_by("-id")[:100])
        for message in rows:
            message.payload_text, message.payload_long = display.value_text(message.payload) if payloads else ("", False)
        return rows

    def _history(self, run, payloads: bool):
        """The audit trail, with the run's own milestones woven in."""
        entries = [(run.created_at, "created", "", "")]
        if run.started_at:
            entries.append((run.started_at, "started", "", "A worker started it"))
        for event in WorkflowEvent.objects.filter(run=run).order_by("at", "id")[:500]:
            detail = event.message
            if event.type == WorkflowEvent.Type.ATTEMPT_ENDED:
                failure = (event.data or {}).get("error") if payloads else None
                detail = f"{detail}: {failure['type'].rpartition('.')[2]}: {failure['message'][:300]}" if failure else detail
            elif payloads and event.data:
                detail = f"{detail} {serialization.display_text(serialization.encode(event.data))[:300]}".strip()
            entries.append((event.at, event.get_type_display(), event.actor or "code", detail))
        if run.finished_at:
            entries.append((run.finished_at, f"ended {run.status.replace('_', ' ')}", "", ""))
        entries.sort(key=lambda entry: entry[0])
        return [{"at": at, "what": what, "who": who, "detail": detail} for at, what, who, detail in entries]

    def _paused(self, run: WorkflowRun, payloads: bool) -> dict | None:
        """The step that paused the run, with its error (the message and traceback with the payload permission)."""
        step = Step.objects.filter(run=run, status=Step.Status.PAUSED).only("key", "attempts", "error").first()
        if step is None:
            return None
        error = serialization.decode(step.error) if payloads and step.error else None
        return {"key": step.key, "attempts": step.attempts,
                "summary": display.error_summary(step.error, with_message=payloads, limit=300),
                "traceback": (error or {}).get("traceback", "") if isinstance(error, dict) else ""}

    def _buttons(self, request, run: WorkflowRun):
        allowed = {
            "cancel": not run.is_finished,
            "retry": run.status in RESUMABLE,
            "force-fail": not run.is_finished,
            "retry-rollback": run.status == Status.COMPENSATION_FAILED,
            "signal": not run.is_finished,
            "wake": not run.is_finished,
            "duplicate": registry.find(run.workflow) is not None,
            "fork": getattr(registry.find(run.workflow), "kind", "task") != "task" and run.started_at is not None,
        }
        return [
            {"name": name, "url": self._url(run.pk, name),
             "title": "Resume" if name == "retry" and run.status in WorkflowRun.HELD else ACTIONS[name].title,
             "danger": ACTIONS[name].destructive}
            for name, ok in allowed.items()
            if ok and self.has_custom_permission(request, ACTIONS[name].permission)
        ]

    def _url(self, pk, action: str | None = None) -> str:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        if action:
            return reverse(f"{self.admin_site.name}:{name}_action", args=[pk, action])
        return reverse(f"{self.admin_site.name}:{name}_change", args=[pk])

    def action_view(self, request, object_id, action):
        spec = ACTIONS.get(action)
        if spec is None:
            raise Http404("No such action.")
        if not self.has_custom_permission(request, spec.permission):
            raise PermissionDenied
        run = self.get_run(object_id)
        keys = []
        if spec.form is forms.StepForm:
            steps = Step.objects.filter(run=run).order_by("seq")
            steps = steps.filter(status=Step.Status.COMPLETED) if action == "edit-step" else \
                steps.exclude(status=Step.Status.COMPLETED)
            keys = list(steps.values_list("key", flat=True)[:200])
        initial = {key: request.GET[key] for key in ("key", "timer", "from_step") if key in request.GET}
        if action == "edit-step" and "key" in initial:
            current = Step.objects.filter(run=run, key=initial["key"]).values_list("result", flat=True).first()
            if current is not None and self.can_see_payloads(request):
                initial["result"] = display.pretty_json(current, limit=None)[0]
        form_kwargs = {"keys": keys} if spec.form is forms.StepForm else {}
        if spec.form is forms.ForkForm:  # the journal's own entries, not the branches of its fan-outs
            branches = set(WorkItem.objects.filter(run=run, kind=WorkItem.Kind.STEP).values_list("step_key", flat=True))
            form_kwargs = {"steps": [row for row in Step.objects.filter(run=run).order_by("seq")
                                     .values_list("seq", "key", "kind", "status")[:500] if row[1] not in branches]}
        if spec.form is forms.SignalForm:
            form_kwargs = {"awaited": catalog.awaited_signals(run.workflow)}
        if request.method == "POST":
            form = spec.form(request.POST, **form_kwargs)
            if form.is_valid():
                try:
                    what = spec.perform(run, form.cleaned_data, request.user.get_username())
                except DurableError as exc:
                    form.add_error(None, str(exc))
                else:
                    self.log_change(request, run, what)
                    self.message_user(request, f"{what}.", messages.SUCCESS)
                    if action in ("duplicate", "fork"):  # to the new run
                        kind = WorkflowEvent.Type.DUPLICATED if action == "duplicate" else WorkflowEvent.Type.FORKED
                        copy = WorkflowEvent.objects.filter(run=run, type=kind) \
                            .order_by("-id").values_list("data", flat=True).first()
                        return HttpResponseRedirect(self._url(copy[action]))
                    return HttpResponseRedirect(self._url(run.pk))
        else:
            form = spec.form(initial=initial, **form_kwargs)
        timer = None
        if action == "wake" and initial.get("timer"):
            timer = Timer.objects.filter(run=run, pk=initial["timer"]).first()
        return TemplateResponse(request, "admin/django_durable/workflowrun/action.html", self.page_context(
            request, f"{spec.title}: {run.workflow} {display.short_id(run.pk)}", action=spec, form=form, run=run,
            runs=[run], bulk=False, keys=keys, timer=timer, run_url=self._url(run.pk),
        ))

    def start_view(self, request):
        if not self.has_custom_permission(request, "start_workflowrun"):
            raise PermissionDenied
        form = forms.StartForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                run = services.start_run(
                    data["workflow"], data["args"], data["kwargs"], queue=data["queue"] or None,
                    idempotency_key=data["idempotency_key"] or None, delay=data["delay"],
                    by=request.user.get_username(),
                )
            except InvalidArguments as exc:
                form.add_error("kwargs" if exc.argument else None, str(exc))
            except (DurableError, ValueError, TypeError) as exc:
                form.add_error(None, str(exc))
            else:
                self.log_addition(request, run, f"Started {run.workflow}")
                self.message_user(request, f"Started run {run.pk} of {run.workflow}.", messages.SUCCESS)
                return HttpResponseRedirect(self._url(run.pk))
        return TemplateResponse(request, "admin/django_durable/workflowrun/start.html",
                                self.page_context(request, "Start a workflow run", form=form))


    # The run list's filters, as the repair page's form takes them.
    LIST_TO_REPAIR = {"status__exact": "status", "workflow": "workflow", "queue": "queue",
                      "created_at__gte": "created_after", "created_at__lt": "created_before"}

    def repair_view(self, request):
        """Repairs by filter: a preview that counts and samples what would change, then the repair,
        applied in batches by a durable.repair run (services/repairs.py)."""
        from ..services import repairs

        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            form = forms.RepairForm(request.POST)
        elif "preview" in request.GET:
            form = forms.RepairForm(request.GET)
        else:
            initial = {"repair": request.GET.get("repair", "retry")}
            for param, field in self.LIST_TO_REPAIR.items():
                if request.GET.get(param):
                    initial[field] = [request.GET[param]] if field == "status" else request.GET[param]
            form = forms.RepairForm(initial=initial)
        plan = None
        if form.is_bound and form.is_valid():
            data = form.cleaned_data
            repair = repairs.REPAIRS[data["repair"]]
            try:
                run_filter = repairs.RunFilter.parse(form.filter_data())
                if request.method == "POST":
                    if not self.has_custom_permission(request, repair.permission):
                        raise PermissionDenied
                    run, planned = repairs.start(data["repair"], run_filter, by=request.user.get_username(),
                                                 reason=data["reason"], from_step=data["from_step"],
                                                 batch=data["batch"] or 200)
                    self.message_user(request, f"Repair started: {repair.verb}, {planned.eligible} run(s) matching "
                                               f"{run_filter}, in batches of {data['batch'] or 200}. This run applies it.",
                                      messages.SUCCESS)
                    return HttpResponseRedirect(self._url(run.pk))
                plan = repairs.plan(data["repair"], run_filter, from_step=data["from_step"])
            except InvalidArguments as exc:
                form.add_error(exc.argument if exc.argument in form.fields else None, str(exc))
        allowed = bool(plan) and self.has_custom_permission(request, repairs.REPAIRS[plan.repair].permission)
        return TemplateResponse(request, "admin/django_durable/workflowrun/repair.html", self.page_context(
            request, "Repair runs by filter", form=form, plan=plan, allowed=allowed,
            filter_text=str(plan.filter) if plan else "",
            sample=[dict(row, url=self._url(row["id"])) for row in plan.sample] if plan else []))


def _id_ends_with(db: str, tail: str) -> Q:
    """Runs whose id ends with `tail`: on PostgreSQL through the index of the ids read backwards
    (migration 0033), elsewhere by the id's text."""
    from django.db import connections

    if connections[db].vendor != "postgresql":
        return Q(id__endswith=tail)
    # The ids first, by themselves: inside the list's statement the subquery was planned as a scan
    # of every run; alone it reads the index, and the list then looks the few ids up.
    with connections[db].cursor() as cursor:
        cursor.execute("SELECT id FROM durable_workflow_run WHERE reverse(id::text) LIKE %s LIMIT 1000",
                       [tail[::-1] + "%"])
        return Q(pk__in=[row[0] for row in cursor.fetchall()])


def run_link(run_id, admin_site_name: str = "admin"):
    if run_id is None:
        return ""
    url = reverse(f"{admin_site_name}:django_durable_workflowrun_change", args=[run_id])
    return format_html('<a href="{}"><code title="{}">{}</code></a>', url, run_id, display.short_id(run_id))
