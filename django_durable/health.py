"""Health for orchestrators: `manage.py durable health` and GET /durable/health/.

Two probes and one full report, each a list of checks that read an index range or a handful of
rows (no count of the runs table), so a probe every few seconds costs the database nothing:

- ``ready`` (a web or worker pod may take traffic): the database answers, and django_durable's
  migrations are all applied (a pod of new code whose migrations have not run is not ready).
- ``live`` (a worker pod's process is not stuck): a worker on this host has reported within
  DURABLE_WORKER_STALE_SECONDS (its maintenance thread writes the report every heartbeat, beside
  the main loop, so a hung step does not make it fail, a hung process does). When the database
  does not answer the probe passes: restarting the pod would not bring the database back.
- ``all`` (monitoring, and the default): ``ready``, plus a live worker for every served queue (the
  queues registered workflows and tasks use, those of DURABLE_QUEUES, and any with work ready),
  the oldest ready item's wait against DURABLE_HEALTH_MAX_LAG_SECONDS per queue, and on
  PostgreSQL whether something holds VACUUM's horizon back longer than
  DURABLE_HEALTH_MAX_HORIZON_SECONDS (django_durable.horizon).
"""

from __future__ import annotations

import hmac
import socket
from dataclasses import asdict, dataclass

from django.db import DatabaseError, connections, transaction
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from . import conf, horizon

PROBES = ("all", "ready", "live")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def report(probe: str = "all", *, queues=None, max_lag: float | None = None, host: str | None = None) -> dict:
    """The checks of `probe` as data: ``{"ok", "probe", "checks": [{"name", "ok", "detail"}]}``."""
    if probe not in PROBES:
        raise ValueError(f"The probe is one of {', '.join(PROBES)}, not {probe!r}.")
    db = conf.get("DATABASE")
    checks = [_database(db)]
    reachable = checks[0].ok
    if probe == "live":
        checks.append(_this_host(host or socket.gethostname()) if reachable else
                      Check("worker on this host", True, "not known: the database does not answer (the probe passes)"))
        counted = checks[1:]  # a database away is not the process's fault
    elif reachable:
        checks.append(_migrations(db))
        if probe == "all" and checks[-1].ok:
            lag = float(conf.get("HEALTH_MAX_LAG_SECONDS") if max_lag is None else max_lag)
            checks.extend(_queues(set(queues) if queues else None, lag))
            checks.append(horizon_check(db))
    if probe != "live":
        counted = checks
    return {"ok": all(check.ok for check in counted), "probe": probe, "checks": [asdict(check) for check in checks]}


def _database(db: str) -> Check:
    try:
        connection = connections[db]
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DatabaseError as exc:
        connections[db].close()
        return Check("database", False, f"{type(exc).__name__}: {str(exc).strip()[:300]}")
    return Check("database", True, f"{connections[db].vendor} answers")


def _migrations(db: str) -> Check:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connections[db])
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == "django_durable"]
    missing = [migration.name for migration, _ in executor.migration_plan(targets)]
    if missing:
        return Check("migrations", False, f"{len(missing)} of django_durable's not applied (the first: {missing[0]}); "
                                          f"run manage.py migrate")
    return Check("migrations", True, "django_durable's are applied")


def _live_workers():
    from .models import Worker
    from .stats import live_workers_since

    return Worker.objects.using(conf.get("DATABASE")).filter(stopped_at__isnull=True, last_seen__gte=live_workers_since())


def _this_host(host: str) -> Check:
    names = list(_live_workers().filter(host=host[:200]).values_list("name", flat=True)[:5])
    if names:
        return Check("worker on this host", True, f"{', '.join(names)} reported within the last "
                                                  f"{conf.get('WORKER_STALE_SECONDS'):g} s")
    return Check("worker on this host", False, f"no worker on {host} has reported within the last "
                                               f"{conf.get('WORKER_STALE_SECONDS'):g} s (DURABLE_WORKER_STALE_SECONDS)")


def served_queues(ready=()) -> set[str]:
    """The queues that need a worker: those registered workflows and tasks use, those of
    DURABLE_QUEUES, and `ready` (those with work ready)."""
    from . import registry

    return {definition.queue for definition in registry.definitions()} | set(conf.get("QUEUES")) | set(ready)


def _queues(queues: set[str] | None, max_lag: float) -> list[Check]:
    from . import stats

    waited = {row["queue"]: row["lag_seconds"] for row in stats.queue_lag(timezone.now()) if row["ready"]}
    wanted = sorted(served_queues(waited) if queues is None else queues)
    unserved = stats.unserved_queues(wanted)
    checks = []
    for queue in wanted:
        problems = []
        if queue in unserved:
            problems.append("no live worker takes work from it")
        if waited.get(queue, 0.0) > max_lag:
            problems.append(f"its oldest ready item has waited {waited[queue]:.0f} s (more than {max_lag:g} s)")
        detail = "; ".join(problems) or (f"served; the oldest ready item has waited {waited[queue]:.1f} s"
                                         if queue in waited else "served; nothing waiting")
        checks.append(Check(f"queue {queue}", not problems, detail))
    if not checks:
        live = _live_workers().count()
        checks.append(Check("workers", bool(live), f"{live} live" if live else "no live worker"))
    return checks


def horizon_check(db: str | None = None) -> Check:
    """The ``horizon`` check: unhealthy while something holds VACUUM's horizon back longer than
    DURABLE_HEALTH_MAX_HORIZON_SECONDS (or DURABLE_HEALTH_MAX_HORIZON_TRANSACTIONS transactions,
    where its age in time is not known). See django_durable.horizon."""
    db = db or conf.get("DATABASE")
    try:
        found = horizon.holders(db)
    except DatabaseError as exc:
        return Check("horizon", True, f"not known: {type(exc).__name__}: {str(exc).strip()[:200]}")
    seconds = float(conf.get("HEALTH_MAX_HORIZON_SECONDS"))
    late = horizon.held_too_long(found, seconds, int(conf.get("HEALTH_MAX_HORIZON_TRANSACTIONS")))
    if late:
        more = f", and {len(late) - 1} more" if len(late) > 1 else ""
        return Check("horizon", False, f"VACUUM cannot clean the queue's tables: {late[0].describe()}{more} "
                                       f"(more than {seconds:g} s; see the cleanup horizon in docs/production.md)")
    if found:
        return Check("horizon", True, f"the oldest holder: {found[0].describe()}")
    return Check("horizon", True, "nothing holds it back" if connections[db].vendor == "postgresql" else "not PostgreSQL")


def as_text(data: dict) -> list[str]:
    """The report as lines: one per check, then the verdict."""
    lines = [f"{'ok ' if check['ok'] else 'FAIL'} {check['name']}: {check['detail']}" for check in data["checks"]]
    lines.append(f"{data['probe']}: {'healthy' if data['ok'] else 'unhealthy'}")
    return lines


@transaction.non_atomic_requests  # (under ATOMIC_REQUESTS a database that does not answer would fail it first)
def health_view(request: HttpRequest) -> JsonResponse:
    """GET /durable/health/?probe=all|ready|live[&queue=Q...][&max_lag=S]: 200 when healthy, 503
    when not. Anyone gets the verdict and each check's name and outcome (an orchestrator's probe
    has no login); a user who may view runs, or the bearer of DURABLE_METRICS_TOKEN, also gets
    each check's detail."""
    from .api.errors import json_error  # errors in the API's shape

    if request.method not in ("GET", "HEAD"):
        return json_error("method_not_allowed", "Only GET.", 405, headers={"Allow": "GET, HEAD"})
    probe = request.GET.get("probe", "all")
    try:
        max_lag = float(request.GET["max_lag"]) if "max_lag" in request.GET else None
        if max_lag is not None and not max_lag >= 0:
            raise ValueError
    except ValueError:
        return json_error("invalid", "max_lag is a number of seconds, 0 or more.", 400)
    if probe not in PROBES:
        return json_error("invalid", f"probe is one of {', '.join(PROBES)}.", 400)
    queues = [name[:100] for name in request.GET.getlist("queue")][:50] or None
    data = report(probe, queues=queues, max_lag=max_lag)
    if not _may_read_details(request):
        data["checks"] = [{"name": check["name"], "ok": check["ok"]} for check in data["checks"]]
    return JsonResponse(data, status=200 if data["ok"] else 503, headers={"Cache-Control": "no-store"})


def _may_read_details(request: HttpRequest) -> bool:
    given = request.headers.get("Authorization", "")
    token = conf.get("METRICS_TOKEN")
    if token and given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), str(token).encode()):
        return True
    user = getattr(request, "user", None)
    try:
        return bool(user and user.is_authenticated and user.has_perm("django_durable.view_workflowrun"))
    except DatabaseError:  # the session or the permissions live in the database that does not answer
        return False
