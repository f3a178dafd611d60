"""Prometheus metrics, read from the database at each scrape (``prometheus-client`` installed).

    # urls.py: path("durable/", include("django_durable.urls")) serves durable/metrics/

Every figure comes from the durable tables, so any web process can serve them and they agree
whichever process is scraped, however many worker hosts there are (no per-process counters to
add up, nothing lost when a worker restarts). Each reads an index range, as the admin's overview
does (the journal through the runs' index). The endpoint answers users who may view runs, or a
request bearing ``Authorization: Bearer <DURABLE_METRICS_TOKEN>`` (for Prometheus' scrape config).

- ``durable_runs{queue, status}``: unfinished runs by status (pending, running, waiting, blocked, paused)
- ``durable_runs_finished{queue, outcome}``: runs finished in the last hour (completed, failed, cancelled)
- ``durable_queue_ready{queue}``, ``durable_queue_lag_seconds{queue}``: items ready now, and how long
  the oldest of them has waited
- ``durable_queue_running{queue}``: items being processed (claimed)
- ``durable_step_duration_seconds{workflow}``: a histogram of the steps of the runs finished in
  the last hour (their last attempt)
- ``durable_step_retries{workflow}``: failed attempts of those steps that were tried again (their
  attempts beyond the first), and ``durable_steps_retrying`` the runs waiting out a step's back-off now
- ``durable_worker_items_processed_total{worker}``: work items each live worker has finished (its
  claims that ended), ``durable_workers_live``
- ``durable_expired_claims``: claims whose lease expired (a worker died or hangs)
"""

from __future__ import annotations

import datetime as dt
import hmac
from collections import defaultdict

from django.contrib.auth.models import AnonymousUser
from django.db import DatabaseError
from django.db.models import Count, F, Sum
from django.http import HttpResponse
from django.utils import timezone

from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.views import APIView

from . import conf, horizon, stats
from .api import errors as api_errors
from .api.errors import SafeJSONRenderer
from .models import Step, Worker, WorkflowRun, WorkItem

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
STEP_SAMPLE = 10_000  # the latest steps of the last hour a histogram is made of, at most


class DurableCollector:
    """A prometheus_client collector whose metrics are queries (see this module)."""

    def __init__(self, db: str | None = None):
        self.db = db

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        db = self.db or conf.get("DATABASE")
        now = timezone.now()
        runs = WorkflowRun.objects.using(db)
        unfinished = GaugeMetricFamily("durable_runs", "Unfinished runs by status.", labels=["queue", "status"])
        for queue, status, n in (runs.filter(status__in=stats.UNFINISHED).order_by()
                                 .values_list("queue", "status").annotate(n=Count("pk"))):
            unfinished.add_metric([queue, status], n)
        yield unfinished

        finished = GaugeMetricFamily("durable_runs_finished", "Runs finished in the last hour, by outcome.",
                                     labels=["queue", "outcome"])
        outcome_of = {status: label for label, statuses in stats.OUTCOMES.items() for status in statuses}
        counts = defaultdict(int)
        for queue, status, n in (runs.filter(finished_at__gte=now - dt.timedelta(hours=1)).order_by()
                                 .values_list("queue", "status").annotate(n=Count("pk"))):
            counts[(queue, outcome_of.get(status, status))] += n
        for (queue, outcome), n in sorted(counts.items()):
            finished.add_metric([queue, outcome], n)
        yield finished

        ready = GaugeMetricFamily("durable_queue_ready", "Work items ready now.", labels=["queue"])
        lag = GaugeMetricFamily("durable_queue_lag_seconds", "How long the oldest ready item has waited.",
                                labels=["queue"])
        running = GaugeMetricFamily("durable_queue_running", "Work items being processed.", labels=["queue"])
        for row in stats.queue_lag(now):
            ready.add_metric([row["queue"]], row["ready"])
            lag.add_metric([row["queue"]], row["lag_seconds"] or 0.0)
            running.add_metric([row["queue"]], row["running"])
        yield ready
        yield lag
        yield running

        yield from self._steps(db, now, HistogramMetricFamily, GaugeMetricFamily)

        processed = CounterMetricFamily("durable_worker_items_processed", "Work items a live worker has finished.",
                                        labels=["worker"])
        live = Worker.objects.using(db).filter(stopped_at__isnull=True, last_seen__gte=stats.live_workers_since())
        count = 0
        for name, n in live.values_list("name", "processed"):
            processed.add_metric([name], n)
            count += 1
        yield processed
        yield GaugeMetricFamily("durable_workers_live", "Workers that reported lately.", value=count)
        yield GaugeMetricFamily("durable_expired_claims", "Claims whose lease expired.",
                                value=WorkItem.objects.using(db).expired().count())
        yield from self._horizon(db, GaugeMetricFamily)

    def _horizon(self, db, GaugeMetricFamily):
        # What holds VACUUM's horizon back (PostgreSQL): the oldest of each kind, its age.
        seconds = GaugeMetricFamily("durable_horizon_age_seconds", "How long the oldest of each kind of holder of "
                                    "VACUUM's horizon has held it (where known).", labels=["kind"])
        transactions = GaugeMetricFamily("durable_horizon_age_transactions", "How many transactions old the "
                                         "horizon the oldest of each kind of holder keeps is.", labels=["kind"])
        try:
            found = horizon.holders(db, limit=20)
        except DatabaseError:
            found = []
        oldest: dict[str, horizon.Holder] = {}
        for holder in found:  # oldest first
            oldest.setdefault(holder.kind, holder)
        for kind, holder in sorted(oldest.items()):
            if holder.seconds is not None:
                seconds.add_metric([kind], holder.seconds)
            transactions.add_metric([kind], holder.transactions)
        yield seconds
        yield transactions

    def _steps(self, db, now, HistogramMetricFamily, GaugeMetricFamily):
        # The steps of the runs finished in the last hour: found through the runs' finished_at index
        # and the journal's (run, key) index, never a scan of the journal, however long it is.
        finished = WorkflowRun.objects.using(db).filter(finished_at__gte=now - dt.timedelta(hours=1)).values("pk")
        recent = (Step.objects.using(db).filter(run__in=finished, kind=Step.Kind.STEP, status__in=Step.FINAL,
                                                started_at__isnull=False)
                  .order_by("-finished_at"))
        durations = defaultdict(list)
        for workflow, started, finished in recent.values_list("run__workflow", "started_at", "finished_at")[:STEP_SAMPLE]:
            durations[workflow].append(max((finished - started).total_seconds(), 0.0))
        histogram = HistogramMetricFamily("durable_step_duration_seconds",
                                          "Steps of the runs finished in the last hour: their last attempt.",
                                          labels=["workflow"])
        for workflow, seconds in sorted(durations.items()):
            buckets, below = [], 0
            ordered = sorted(seconds)
            index = 0
            for bound in BUCKETS:
                while index < len(ordered) and ordered[index] <= bound:
                    index += 1
                below = index
                buckets.append((str(bound), below))
            buckets.append(("+Inf", len(ordered)))
            histogram.add_metric([workflow], buckets, sum_value=sum(ordered))
        yield histogram
        retries = GaugeMetricFamily("durable_step_retries",
                                    "Failed attempts, tried again, of the steps of the runs finished in the last hour.",
                                    labels=["workflow"])
        for workflow, n in (recent.filter(attempts__gt=1).order_by().values_list("run__workflow")
                            .annotate(n=Sum(F("attempts") - 1))):
            retries.add_metric([workflow], n)
        yield retries
        # Read from the waiting runs (the status index), not by a scan of the journal's statuses.
        in_back_off = WorkflowRun.objects.using(db).filter(status=WorkflowRun.Status.WAITING).waiting_for("retry")
        yield GaugeMetricFamily("durable_steps_retrying", "Runs waiting out a step's back-off before its next attempt.",
                                value=in_back_off.count())


SCRAPER = "metrics-token"  # request.auth of a caller that gave DURABLE_METRICS_TOKEN


class MetricsToken(BaseAuthentication):
    """``Authorization: Bearer <DURABLE_METRICS_TOKEN>``, for Prometheus' scrape config."""

    def authenticate(self, request):
        given = request.headers.get("Authorization", "")
        if not given.startswith("Bearer "):
            return None  # the API's own authentication (session, Basic, ...) may know the caller
        token = conf.get("METRICS_TOKEN")
        if not token or not hmac.compare_digest(given[7:].encode(), str(token).encode()):
            raise AuthenticationFailed("The bearer token is not DURABLE_METRICS_TOKEN.")
        return AnonymousUser(), SCRAPER

    def authenticate_header(self, request):
        return 'Bearer realm="durable metrics"'


class MayScrape(BasePermission):
    message = ("Reading the metrics needs the permission django_durable.view_workflowrun, or the bearer "
               "token DURABLE_METRICS_TOKEN.")

    def has_permission(self, request, view):
        user = request.user
        return request.auth is SCRAPER or bool(user and user.is_authenticated
                                               and user.has_perm("django_durable.view_workflowrun"))


class JSONErrors(BaseContentNegotiation):
    """The answer is Prometheus' text whatever the client accepts; an error is JSON."""

    def select_parser(self, request, parsers):
        return None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class MetricsView(APIView):
    """GET: the metrics in Prometheus' text format; errors as JSON, as the REST API's.

    The callers the REST API accepts (the project's DEFAULT_AUTHENTICATION_CLASSES: a session, Basic,
    ...) with the permission to view runs may read them, and so may the bearer of DURABLE_METRICS_TOKEN.
    """

    renderer_classes = [SafeJSONRenderer]
    content_negotiation_class = JSONErrors
    permission_classes = [MayScrape]

    def get_authenticators(self):
        return [MetricsToken(), *super().get_authenticators()]

    def get_exception_handler(self):
        return api_errors.handle

    def get(self, request):
        try:
            from prometheus_client import CollectorRegistry, generate_latest
            from prometheus_client.exposition import CONTENT_TYPE_LATEST
        except ImportError:  # after the permission check: a stranger learns nothing of the install
            raise NotInstalled() from None
        registry = CollectorRegistry(auto_describe=False)
        registry.register(DurableCollector())
        return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


class NotInstalled(APIException):
    status_code = 501
    default_code = "not_installed"
    default_detail = "Install prometheus-client to serve metrics (pip install django-durable-workflows[prometheus])."


metrics_view = MetricsView.as_view()
