"""The admin and api sections of the benchmark: the operator dashboard and the REST API on a large table.

Fills PostgreSQL with `runs` runs of `steps` steps each (set-based INSERTs), then requests each
page `loads` times through Django's full request stack (test client, a logged-in superuser)
and reports the p50 and p95 times and the queries per page. The API's status route is also
measured against a bare Django view that reads the same row (one query, JsonResponse), in the
same loop, so the ratio says what DRF, the permissions and the serializer cost.
"""

from __future__ import annotations

import statistics
import time

from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

TABLES = "durable_step, durable_work_item, durable_timer, durable_signal, durable_workflow_event, durable_workflow_run"


def fill(runs: int, steps: int) -> None:
    """Runs over the last 30 days: mostly completed, some failed, waiting, sleeping, pending or running."""
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLES}, durable_worker CASCADE")
        cursor.execute(
            """
            INSERT INTO durable_workflow_run (id, workflow, status, waiting_on, input, result, error, attempt,
                max_attempts, queue, priority, created_at, started_at, updated_at, finished_at)
            SELECT id, 'bench.flow_' || (i %% 7), status,
                CASE status WHEN 'waiting' THEN 'signal ''approved''' ELSE '' END,
                '{"args":[],"kwargs":{"order_id":' || i || '}}',
                CASE status WHEN 'completed' THEN '{"ok":true}' END,
                CASE status WHEN 'failed' THEN '{"type":"builtins.KeyError","message":"order ' || i
                    || ' is missing","traceback":"Traceback (most recent call last): ..."}' END,
                1, 1, CASE WHEN i %% 3 = 0 THEN 'emails' ELSE 'default' END, 0,
                created, created + interval '5 ms', created + interval '60 ms',
                CASE WHEN status IN ('completed', 'failed', 'cancelled') THEN created + interval '60 ms' END
            FROM (
                SELECT i, gen_random_uuid() AS id,
                    now() - (i * (interval '30 days' / %(runs)s)) AS created,
                    CASE WHEN i %% 50 = 0 THEN 'failed' WHEN i %% 97 = 0 THEN 'waiting'
                         WHEN i %% 89 = 0 THEN 'cancelled' WHEN i < 20 THEN 'pending'
                         WHEN i < 24 THEN 'running' ELSE 'completed' END AS status
                FROM generate_series(1, %(runs)s) AS i
            ) AS generated
            """,
            {"runs": runs},
        )
        cursor.execute(
            """
            INSERT INTO durable_step (run_id, key, seq, kind, name, status, result, error, attempts, started_at,
                finished_at)
            SELECT r.id, 'step-' || s, s, 'step', 'bench.work', 'completed', '{"n":' || s || '}', NULL, 1,
                r.created_at + s * interval '5 ms', r.created_at + s * interval '5 ms' + interval '4 ms'
            FROM durable_workflow_run AS r, generate_series(1, %(steps)s) AS s
            """,
            {"steps": steps},
        )
        cursor.execute(
            """
            INSERT INTO durable_work_item (kind, run_id, step_key, "group", function, queue, priority, status,
                available_at, attempts, wake, claimed_by, claim_expires_at, claim_token, last_error, created_at)
            SELECT 'advance', id, '', '', '', queue, 0,
                CASE status WHEN 'pending' THEN 'pending' WHEN 'running' THEN 'processing' ELSE 'completed' END,
                created_at, 0, false, CASE status WHEN 'running' THEN 'bench:1' ELSE '' END,
                CASE status WHEN 'running' THEN now() + interval '30 s' END,
                CASE status WHEN 'running' THEN gen_random_uuid() END, '', created_at
            FROM durable_workflow_run
            """
        )
        cursor.execute(
            """
            INSERT INTO durable_timer (kind, run_id, step_key, fire_at, status, created_at)
            SELECT 'signal_timeout', id, 'signal:approved:0', now() + interval '1 day', 'pending', created_at
            FROM durable_workflow_run WHERE status = 'waiting'
            """
        )
        cursor.execute(
            "INSERT INTO durable_worker (name, host, pid, queues, started_at, last_seen, processed, current) "
            "VALUES ('bench:1', 'bench', 1, '', now(), now(), 0, '')"
        )
        cursor.execute(f"VACUUM ANALYZE {', '.join(t.strip() for t in TABLES.split(','))}")


def measure(client: Client, url: str, loads: int, *, explain=None) -> dict:
    """p50 and p95 of `loads` loads of `url`, and the queries one load makes; with `explain`, also
    what explain(those queries) says of them (bench/admin_scale.py: the whole reads)."""
    client.get(url)  # warm: templates compiled, connection open
    times = []
    for _ in range(loads):
        started = time.perf_counter()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    times.sort()
    figures = {"p50_ms": statistics.median(times), "p95_ms": times[int(0.95 * (len(times) - 1))],
               "queries": len(queries)}
    if explain is not None:
        figures["whole_reads"] = explain(queries.captured_queries)
    return figures


def pages(runs: int = 100_000, steps: int = 10, loads: int = 20, *, admin: bool = True, api: bool = True) -> dict:
    started = time.perf_counter()
    fill(runs, steps)
    figures = {"fill_s": time.perf_counter() - started}
    user, _ = get_user_model().objects.get_or_create(username="bench-admin", defaults={"is_staff": True,
                                                                                       "is_superuser": True})
    client = Client()
    client.force_login(user)
    if admin:
        figures.update({f"admin_{k}": v for k, v in admin_pages(client, loads).items()})
    if api:
        figures.update({f"api_{k}": v for k, v in api_pages(client).items()})
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLES}, durable_worker CASCADE")
    return figures


def api_pages(client: Client, requests: int = 2000) -> dict:
    """GET workflows/{id}/ for `requests` different runs, interleaved with the bare view on the same ids."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM durable_workflow_run ORDER BY random() LIMIT %s", [requests])
        ids = [row[0] for row in cursor.fetchall()]
    routes = {"status": "/api/durable/workflows/{}/", "bare": "/bare/{}/",
              "status_steps": "/api/durable/workflows/{}/?include=steps"}
    times = {name: [] for name in routes}
    for name, url in routes.items():
        client.get(url.format(ids[0]))  # warm
    order = list(routes.items())
    for i, run_id in enumerate(ids):
        for name, url in order[i % 3:] + order[:i % 3]:  # each route comes first as often: a cold row is shared
            started = time.perf_counter()
            response = client.get(url.format(run_id))
            times[name].append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (url, response.status_code)
    figures = {}
    for name, url in routes.items():
        with CaptureQueriesContext(connection) as queries:
            client.get(url.format(ids[0]))
        figures[f"{name}_queries"] = len(queries)
        figures[f"{name}_per_s"] = 1000 * len(ids) / sum(times[name])
        figures[f"{name}_p50_ms"] = statistics.median(times[name])
        figures[f"{name}_p95_ms"] = sorted(times[name])[int(0.95 * (len(ids) - 1))]
    figures["status_vs_bare"] = figures["status_p50_ms"] / figures["bare_p50_ms"]
    figures.update({f"list_{k}": v for k, v in measure(client, "/api/durable/workflows/?status=failed", 20).items()})
    return figures


def admin_pages(client: Client, loads: int) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM durable_workflow_run WHERE status = 'failed' LIMIT 1")
        failed = cursor.fetchone()[0]
    base = "/admin/django_durable/workflowrun/"
    urls = {
        "changelist": base,
        "changelist_failed": f"{base}?status=failed",
        "changelist_stuck": f"{base}?stuck=any",
        "changelist_search_id": f"{base}?q={failed}",
        "overview": "/admin/django_durable/overview/",
        "run_detail": f"{base}{failed}/change/",
        "work_items": "/admin/django_durable/workitem/",
    }
    figures = {}
    for name, url in urls.items():
        for key, value in measure(client, url, loads).items():
            figures[f"{name}_{key}"] = value
    return figures
