"""The DURABLE_* settings: documented defaults, read lazily from django.conf.settings."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    # How long a claim on a work item lasts without a heartbeat, in seconds.
    "LEASE_SECONDS": 30.0,
    # How often a worker extends the claims it holds; a fraction of the lease.
    "HEARTBEAT_SECONDS": 10.0,
    # How often each worker returns expired claims to pending, in seconds.
    "REAPER_INTERVAL": 10.0,
    # Seconds an idle worker waits between polls when no notification arrives.
    "POLL_INTERVAL": 1.0,
    # With a backlog of quick items, how many a worker claims (and ends) in one statement at most,
    # on PostgreSQL; 1: one at a time always (see docs/performance.md, "Batches").
    "CLAIM_BATCH": 64,
    # Claims of one work item whose worker died before the item ends `failed`.
    "MAX_DELIVERIES": 5,
    # Seconds a stopping worker lets its in-flight step finish before releasing it.
    "SHUTDOWN_GRACE_SECONDS": 30.0,
    # Use LISTEN/NOTIFY on PostgreSQL to wake idle workers at once (polling stays on).
    "LISTEN_NOTIFY": True,
    # The DATABASES alias the listening sessions connect through (the workers' and wait()'s),
    # when DURABLE_DATABASE goes through a transaction pooler, in which LISTEN hears nothing:
    # one that reaches the same server directly. None: DURABLE_DATABASE.
    "LISTEN_DATABASE": None,
    # The retry policy of steps that name none (nor their workflow): a durable.RetryPolicy or
    # a dict of its fields. None: 3 attempts, 1 s back-off doubling up to 60 s, 10% jitter.
    "DEFAULT_RETRY": None,
    # Seconds a step may run past its timeout, ignoring the StepTimeout raised in it, before
    # its worker process is replaced.
    "STEP_KILL_GRACE_SECONDS": 5.0,
    # How long a run (or branch) whose workflow (or function) a worker does not have is left for
    # a worker that has it, as in a rolling deploy, before it fails; in seconds.
    "MISSING_CODE_GRACE_SECONDS": 600.0,
    # Seconds a running step may go on after its run was cancelled (to finish, or to notice
    # ctx.cancel_requested and stop) before durable.Cancelled is raised in it.
    "CANCEL_GRACE_SECONDS": 5.0,
    # The largest encoded input, result, signal or event payload accepted, in bytes.
    "MAX_PAYLOAD_BYTES": 2 * 1024 * 1024,
    # Prepare the worker's own hot-path statements on PostgreSQL. Turn off behind a
    # transaction-mode pooler that cannot keep prepared statements (PgBouncer before 1.21).
    "PREPARED_STATEMENTS": True,
    # A schedule's fire time later than this (seconds) counts as missed: its catch-up policy
    # decides whether it still runs. Within it, a late fire time just runs late.
    "SCHEDULE_GRACE_SECONDS": 60.0,
    # With catch_up="all", the most missed fire times run after downtime (the latest ones).
    "MAX_CATCH_UP": 100,
    # After how many seconds without a report a worker counts as gone: the admin marks it
    # stale, and warns on every durable page when no worker is live.
    "WORKER_STALE_SECONDS": 60.0,
    # `durable health` and GET /durable/health/: a queue whose oldest ready item has waited longer
    # than this (seconds) is unhealthy.
    "HEALTH_MAX_LAG_SECONDS": 300.0,
    "HEALTH_MAX_HORIZON_SECONDS": 300.0,
    "HEALTH_MAX_HORIZON_TRANSACTIONS": 1_000_000,
    # GET /api/durable/workflows/{id}/stream/: how long one response streams before it ends (the
    # browser reconnects at once, with Last-Event-ID), so that no request is held for ever.
    "STREAM_MAX_SECONDS": 300.0,
    # How long finished runs are kept before the prune deletes them (a workflow's own
    # retention= wins): a timedelta or seconds.
    "RETENTION": 30 * 24 * 3600.0,
    # How long emitted events are kept for runs that begin waiting for them later (a timedelta
    # or seconds; 0 keeps none: an event reaches only the runs waiting when it is emitted).
    "EVENT_RETENTION": 7 * 24 * 3600.0,
    # Inputs, results and signal payloads whose JSON is larger than this many bytes are written to
    # STORAGES["durable"] and read back when needed (payloads.py); None: all stay in the tables
    # (up to DURABLE_MAX_PAYLOAD_BYTES).
    "PAYLOAD_OFFLOAD_BYTES": None,
    # When the built-in workflow durable.prune deletes what is past its retention: a cron
    # expression (UTC), or a dict of ensure_schedule() options; None: only `durable prune` does.
    "PRUNE_SCHEDULE": "17 3 * * *",
    # A secret that lets Prometheus read durable/metrics/ ("Authorization: Bearer <token>"); None:
    # only logged-in users who may view runs can.
    "METRICS_TOKEN": None,
    # The format of the worker's own log lines when the project configured no logging: "text",
    # or "json" (one object per line with run_id, workflow and step_key).
    "LOG_FORMAT": "text",
    # How long an e-mailed approval link (durable.approval_link()) can be used, in seconds.
    "APPROVAL_LINK_MAX_AGE": 3 * 24 * 3600.0,
    # The REST API: DRF permission classes every route requires (classes or dotted paths), on
    # top of the per-action model permissions. The default admits staff users only, whatever
    # the project's DEFAULT_PERMISSION_CLASSES say.
    "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    # A callable (or its dotted path) (request, queryset) -> queryset that narrows the runs a
    # user may see through the API; a run outside it is a 404. None: every run.
    "API_QUERYSET_FILTER": None,
    # Per-user request rates of the API's writing routes (DRF rate strings); None: unlimited.
    "API_THROTTLE_RATES": {"start": "120/min", "signal": "300/min", "cancel": "60/min"},
    # The longest a GET .../result/?wait= request holds, in seconds.
    "API_MAX_WAIT": 30.0,
    # Limits per queue, enforced across every worker: {"emails": {"concurrency": 5,
    # "key_concurrency": 1, "rate_limit": "10/s"}}. A queue not named has none (queues.py).
    "QUEUES": {},
    # `manage.py check --deploy` replays the journals of the runs in flight against the code
    # installed now and reports those it would break (django_durable.E010). It reads the
    # database; False skips it.
    "CHECK_REPLAY": True,
    # Which database alias holds the durable tables.
    "DATABASE": "default",
    # Named fault points for the fault tests ("point=action;point=action"); off in production.
    "FAULTS": "",
}


@cache
def get(name: str) -> Any:
    """Return the value of DURABLE_<name>, or its default."""
    if name not in DEFAULTS:
        raise KeyError(f"{name!r} is not a django-durable setting")
    return getattr(django_settings, f"DURABLE_{name}", DEFAULTS[name])


@cache
def vendor(db: str) -> str:
    """The vendor of the database alias `db` ("postgresql", "sqlite"): read once per alias, for
    the paths that choose their SQL per item (Django's connections[db] is a thread-local lookup)."""
    from django.db import connections

    return connections[db].vendor


def is_postgres(db: str) -> bool:
    """Whether the database alias `db` is PostgreSQL: the one question, read once per alias (vendor())."""
    return vendor(db) == "postgresql"


def listens(db: str) -> bool:
    """Whether NOTIFY wakes the listeners of database alias `db` (workers, durable.wait(), stream
    readers): PostgreSQL with DURABLE_LISTEN_NOTIFY. Elsewhere they poll."""
    return vendor(db) == "postgresql" and get("LISTEN_NOTIFY")


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("DURABLE_"):
        get.cache_clear()
    elif setting == "DATABASES":
        vendor.cache_clear()
