"""Health for orchestrators: `manage.py durable health` and GET /durable/health/ (django_durable.health)."""

from __future__ import annotations

import datetime as dt
import io
import json
import socket

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connections
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings
from django.utils import timezone

import django_durable as durable
from django_durable import health
from django_durable.models import Worker, WorkItem
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db


@durable.workflow("tests.health.report", queue="reports")
def report_flow(ctx):
    return "done"


def a_worker(name="pod-a:1", *, queues="", host=None, seen_ago=0.0):
    now = timezone.now()
    return Worker.objects.create(name=name, host=host or socket.gethostname(), pid=1, queues=queues,
                                 started_at=now - dt.timedelta(minutes=5),
                                 last_seen=now - dt.timedelta(seconds=seen_ago))


def checks(data) -> dict:
    return {check["name"]: check for check in data["checks"]}


def command(*args) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("durable", "health", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def test_ready_needs_the_database_and_every_migration():
    data = health.report("ready")
    assert data["ok"] and set(checks(data)) == {"database", "migrations"}
    assert command("--probe", "ready")[0] == 0

    last = MigrationRecorder.Migration.objects.filter(app="django_durable").order_by("-name").first()
    last.delete()  # as on a pod whose new code's migration has not run (rolled back with the test)
    data = health.report("ready")
    assert not data["ok"]
    assert checks(data)["migrations"]["detail"].startswith(f"1 of django_durable's not applied (the first: {last.name})")
    code, out = command("--probe", "ready")
    assert code == 1 and "FAIL migrations" in out and out.rstrip().endswith("ready: unhealthy")


def test_every_queue_in_use_needs_a_live_worker_and_a_short_wait():
    data = health.report()
    assert not data["ok"]
    assert checks(data)["queue default"]["detail"] == "no live worker takes work from it"
    assert "queue reports" in checks(data)  # the queue a registered workflow declares

    a_worker(queues="default")
    data = health.report()
    assert checks(data)["queue default"]["ok"] and not checks(data)["queue reports"]["ok"]
    a_worker("pod-b:1", queues="")  # every queue
    assert health.report()["ok"]

    run = durable.start("tests.three_steps", x=1)
    WorkItem.objects.filter(run=run).update(available_at=timezone.now() - dt.timedelta(minutes=10))
    data = health.report()
    assert not data["ok"] and "has waited 600 s (more than 300 s)" in checks(data)["queue default"]["detail"]
    assert health.report(max_lag=3600)["ok"]
    assert command("--max-lag", "3600", "--json")[0] == 0
    code, out = command("--queue", "default")
    assert code == 1 and "FAIL queue default" in out and "queue reports" not in out

    with override_settings(DURABLE_WORKER_STALE_SECONDS=1):
        Worker.objects.update(last_seen=timezone.now() - dt.timedelta(seconds=5))
        assert "no live worker" in checks(health.report(max_lag=3600))["queue default"]["detail"]


def test_live_asks_for_a_worker_on_this_host_and_passes_when_the_database_is_away(monkeypatch):
    assert not health.report("live")["ok"]
    a_worker(host="another-host")
    assert not health.report("live")["ok"]
    a_worker("here:1")
    data = health.report("live")
    assert data["ok"] and checks(data)["worker on this host"]["detail"].startswith("here:1 reported")

    def away():
        raise OperationalError("connection refused")

    monkeypatch.setattr(connections["default"], "ensure_connection", away)
    live, ready = health.report("live"), health.report("ready")
    assert live["ok"] and "the database does not answer" in live["checks"][1]["detail"]
    assert not ready["ok"] and checks(ready)["database"]["detail"] == "OperationalError: connection refused"


def test_the_endpoint_answers_503_and_tells_details_only_to_those_who_may_see_runs(client, admin_client):
    answer = client.get("/durable/health/")
    assert answer.status_code == 503 and answer["Cache-Control"] == "no-store"
    body = answer.json()
    assert body["ok"] is False and all(set(check) == {"name", "ok"} for check in body["checks"])
    assert client.get("/durable/health/?probe=ready").status_code == 200

    detailed = admin_client.get("/durable/health/").json()
    assert checks(detailed)["queue default"]["detail"] == "no live worker takes work from it"
    with override_settings(DURABLE_METRICS_TOKEN="s3cret"):
        assert "detail" in client.get("/durable/health/", HTTP_AUTHORIZATION="Bearer s3cret").json()["checks"][0]

    a_worker()
    assert client.get("/durable/health/").status_code == 200
    assert client.get("/durable/health/?probe=live").status_code == 200
    # Errors in the REST API's shape.
    sideways = client.get("/durable/health/?probe=sideways")
    assert sideways.status_code == 400
    assert sideways.json() == {"error": {"code": "invalid", "message": "probe is one of all, ready, live."}}
    assert client.get("/durable/health/?max_lag=soon").json()["error"]["code"] == "invalid"
    posted = client.post("/durable/health/")
    assert posted.status_code == 405 and posted.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_fails_the_probes_once_its_reports_stop(start_worker, worker_env):
    worker = start_worker(burst=False)
    wait_for(lambda: health.report("live")["ok"], timeout=60, message="the worker's first report")
    assert health.report(max_lag=3600)["ok"], health.report(max_lag=3600)
    code, out = command("--probe", "live", "--json")
    assert code == 0 and json.loads(out)["ok"]

    worker.kill()  # SIGKILL: no goodbye, its row keeps saying it is alive until it goes stale
    with override_settings(DURABLE_WORKER_STALE_SECONDS=2):
        wait_for(lambda: not health.report("live")["ok"], timeout=30, message="the report going stale")
        assert command("--probe", "live")[0] == 1
        assert not health.report(max_lag=3600)["ok"]
