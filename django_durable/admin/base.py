"""What every durable admin page shares: read-only by default, a count that never scans the whole
table, and a banner when no worker is running."""

from __future__ import annotations

from contextlib import contextmanager

import uuid
from functools import cached_property

from django.contrib import admin
from django.core.paginator import Paginator

from .. import conf
from ..models import Worker
from ..stats import live_workers_since
from .display import relative

LIST_COUNT_CAP = 10_000


class CappedPaginator(Paginator):
    """Counts at most LIST_COUNT_CAP rows (an index range scan), never the whole table."""

    capped = False

    @cached_property
    def count(self) -> int:
        # Just the ids, unordered: the database stops after LIST_COUNT_CAP + 1 rows.
        found = self.object_list.order_by().values("pk")[: LIST_COUNT_CAP + 1].count()
        self.capped = found > LIST_COUNT_CAP
        return min(found, LIST_COUNT_CAP)


@contextmanager
def without_jit(db: str):
    """A transaction in which PostgreSQL does not JIT-compile: a list filter over many unfinished
    runs (the stuck one's subqueries) is priced past jit_above_cost, and at 10 million runs the
    compiling took 300-400 ms of a 100 ms query. Elsewhere nothing."""
    from django.db import connections, transaction

    if connections[db].vendor != "postgresql":
        yield
        return
    with transaction.atomic(using=db):
        with connections[db].cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
        yield


def worker_banner() -> str:
    """A warning when no worker has reported recently, else ''."""
    workers = Worker.objects.using(conf.get("DATABASE"))
    if workers.filter(stopped_at__isnull=True, last_seen__gte=live_workers_since()).exists():
        return ""
    last = workers.order_by("-last_seen").values_list("last_seen", flat=True).first()
    seen = f"No worker has been seen for {relative(last).removesuffix(' ago')}" if last else "No worker has reported yet"
    return f"{seen}: runs will not advance until one runs (python manage.py durable_worker)."


class DurableAdmin(admin.ModelAdmin):
    """Read-only unless a subclass says otherwise; every page carries the worker banner."""

    show_full_result_count = False
    paginator = CappedPaginator

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def durable_context(self, request, extra=None) -> dict:
        return {"durable_banner": worker_banner(), **(extra or {})}

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, self.durable_context(request, extra_context))

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        return super().changeform_view(request, object_id, form_url, self.durable_context(request, extra_context))

    def delete_view(self, request, object_id, extra_context=None):
        return super().delete_view(request, object_id, self.durable_context(request, extra_context))

    def history_view(self, request, object_id, extra_context=None):
        return super().history_view(request, object_id, self.durable_context(request, extra_context))

    def page_context(self, request, title: str, **extra) -> dict:
        """The context of a custom page of this admin, as Django's own pages have it."""
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "durable_banner": worker_banner(),
            **extra,
        }

    def has_custom_permission(self, request, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")


def parse_uuid(value) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        return None


class PageAdmin(DurableAdmin):
    """A page of its own (the overview, the workflow definitions) on a proxy model without rows:
    seen by whoever may see runs, its list URL the page itself."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(f"{self.opts.app_label}.view_workflowrun")

    def has_delete_permission(self, request, obj=None):
        return False

    def page_urls(self, *extra):
        """The page's URL (named as a changelist, so the admin's index links to it), then `extra`."""
        from django.urls import path

        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=f"{name}_changelist"), *extra]

    def check_view(self, request) -> None:
        if not self.has_view_permission(request):
            from django.core.exceptions import PermissionDenied

            raise PermissionDenied


def base_actions(model_admin, cls, request, action_location=None) -> dict:
    """The actions `cls`'s parent offers: Django 6.1 names where they are shown (`action_location`),
    5.2 does not know the parameter. For a get_actions() override that works on both."""
    parent = super(cls, model_admin)
    if action_location is None:
        return parent.get_actions(request)
    return parent.get_actions(request, action_location=action_location)
