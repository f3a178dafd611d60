"""Schedules: validated like ensure_schedule() (it saves them), described in words, with their next
fire times; pause, resume and run now. Schedules declared in code are changed in code."""

from __future__ import annotations

from zoneinfo import available_timezones

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join

from .. import registry, schedules, serialization
from ..exceptions import DurableError
from ..models import Schedule
from . import display
from .base import DurableAdmin
from .forms import JSONValueField
from .runs import run_link


class ScheduleForm(forms.ModelForm):
    workflow = forms.ChoiceField(choices=())
    args = JSONValueField(expect=list, label="Positional arguments (JSON list)")
    kwargs = JSONValueField(expect=dict, label="Keyword arguments (JSON object)")
    timezone = forms.CharField(max_length=64, initial="UTC",
                               widget=forms.TextInput(attrs={"list": "durable-time-zones", "size": 30}))

    class Meta:
        model = Schedule
        fields = ["slug", "workflow", "cron", "interval", "timezone", "args", "kwargs", "overlap", "catch_up", "queue",
                  "status"]
        help_texts = {
            "cron": "Five fields: minute hour day-of-month month day-of-week, e.g. '0 3 * * mon-fri'.",
            "interval": "Or seconds between fire times.",
        }

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["workflow"].choices = [(name, name) for name in registry.names()]
        if self.instance.pk:
            self.initial["args"] = self.instance.args
            self.initial["kwargs"] = self.instance.kwargs

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            schedules._validated(
                data["slug"] if "slug" in data else self.instance.slug, data["workflow"], data.get("cron") or None,
                data.get("interval"), data["timezone"], data["overlap"], data["catch_up"], data.get("queue") or None,
            )
        except DurableError as exc:
            raise ValidationError(str(exc)) from None
        return data


@admin.register(Schedule)
class ScheduleAdmin(DurableAdmin):
    form = ScheduleForm
    list_display = ["slug", "workflow", "when", "state", "next_fire", "last_run_link", "declared"]
    list_filter = ["status", "declared"]
    search_fields = ["slug", "workflow"]
    actions = ["pause", "resume", "run_now"]

    def has_add_permission(self, request):
        return admin.ModelAdmin.has_add_permission(self, request)

    def has_change_permission(self, request, obj=None):
        return admin.ModelAdmin.has_change_permission(self, request, obj)

    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.declared:
            return False  # the next sync would create it again: remove it from the code
        return super().has_delete_permission(request, obj)

    def has_trigger_permission(self, request):
        return self.has_custom_permission(request, "trigger_schedule")

    def has_pause_permission(self, request):
        return self.has_change_permission(request)

    COMPUTED = ["description", "upcoming", "next_fire_at", "last_fire_at", "last_run_link", "declared"]
    DECLARED = ["slug", "workflow", "cron", "interval", "timezone", "show_args", "show_kwargs", "overlap", "catch_up",
                "queue"]

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return self.COMPUTED
        if obj.declared:  # its definition lives in code; only its status is the operator's
            return [*self.DECLARED, *self.COMPUTED]
        return ["slug", *self.COMPUTED]

    def get_fields(self, request, obj=None):
        if obj is not None and obj.declared:
            return [*self.DECLARED, "status", *self.COMPUTED]
        return [*ScheduleForm.Meta.fields, *self.COMPUTED]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is not None and obj.declared:
            kwargs["fields"] = ["status"]
            kwargs["form"] = forms.ModelForm
        return super().get_form(request, obj, change, **kwargs)

    def save_model(self, request, obj, form, change):
        """Saved by the scheduler's own functions, so that its next fire time is right."""
        data = form.cleaned_data
        if obj.declared:
            (schedules.resume if data["status"] == Schedule.Status.ACTIVE else schedules.pause)(obj.slug)
            return
        saved = schedules.ensure_schedule(
            obj.slug if change else data["slug"], data["workflow"], cron=data.get("cron") or None,
            interval=data.get("interval"), timezone=data["timezone"], args=data["args"], kwargs=data["kwargs"],
            overlap=data["overlap"], catch_up=data["catch_up"], queue=data.get("queue") or None,
            enabled=data["status"] == Schedule.Status.ACTIVE,
        )
        obj.pk = saved.pk

    def render_change_form(self, request, context, *args, **kwargs):
        context["time_zones"] = sorted(available_timezones())
        return super().render_change_form(request, context, *args, **kwargs)

    @admin.display(description="when")
    def when(self, schedule):
        text = display.describe_cron(schedule.cron) if schedule.cron else display.humanize_interval(schedule.interval)
        zone = f" ({schedule.timezone})" if schedule.cron and schedule.timezone != "UTC" else ""
        return format_html('<span title="{}">{}{}</span>', schedule.cron or f"{schedule.interval:g} s", text, zone)

    @admin.display(description="described")
    def description(self, schedule):
        return self.when(schedule) if schedule.pk else ""

    @admin.display(description="status", ordering="status")
    def state(self, schedule):
        return display.status_badge("completed" if schedule.status == "active" else "cancelled", schedule.status)

    @admin.display(description="next fire", ordering="next_fire_at")
    def next_fire(self, schedule):
        if schedule.status != Schedule.Status.ACTIVE or schedule.next_fire_at is None:
            return ""
        return format_html('<span title="{}">{}</span>', schedule.next_fire_at.isoformat(sep=" ", timespec="seconds"),
                           display.relative(schedule.next_fire_at))

    @admin.display(description="next 5 fire times")
    def upcoming(self, schedule):
        if not schedule.pk:
            return ""
        times = schedule.next_runs(5)
        return format_html("<ol class=\"durable-times\">{}</ol>", format_html_join(
            "", "<li>{}</li>", ((moment.isoformat(sep=" ", timespec="seconds"),) for moment in times)))

    @admin.display(description="last run")
    def last_run_link(self, schedule):
        return run_link(schedule.last_run_id, self.admin_site.name)

    @admin.display(description="arguments")
    def show_args(self, schedule):
        return serialization.display_text(schedule.args)

    @admin.display(description="keyword arguments")
    def show_kwargs(self, schedule):
        return serialization.display_text(schedule.kwargs)

    @admin.action(description="Pause selected schedules", permissions=["pause"])
    def pause(self, request, queryset):
        self._each(request, queryset, schedules.pause, "Paused")

    @admin.action(description="Resume selected schedules", permissions=["pause"])
    def resume(self, request, queryset):
        self._each(request, queryset, schedules.resume, "Resumed")

    @admin.action(description="Run selected schedules now", permissions=["trigger"])
    def run_now(self, request, queryset):
        self._each(request, queryset, schedules.trigger, "Started a run of")

    def _each(self, request, queryset, service, verb: str) -> None:
        done, failed = 0, []
        for schedule in queryset[:1000]:
            try:
                service(schedule.slug)
            except DurableError as exc:
                failed.append(f"{schedule.slug}: {exc}")
                continue
            done += 1
            self.log_change(request, schedule, f"{verb} the schedule")
        self.message_user(request, f"{verb} {done} schedule(s); {len(failed)} skipped."
                          + (f" {failed[0]}" if failed else ""), messages.SUCCESS if done else messages.WARNING)
