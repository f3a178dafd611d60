"""Starts gated by a key: singleton, debounce and throttle (services/gates.py), alone and under
concurrent producers on PostgreSQL."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import StartGate, Timer, WorkflowRun
from django_durable.testing import clock, drain
from tests.conftest import ON_POSTGRES
from tests.harness.workers import in_threads

pytestmark = pytest.mark.django_db


@durable.workflow("tests.gates.sync_account")
def sync_account(ctx, account, n=0):
    return {"account": account, "n": n}


@durable.workflow("tests.gates.report", singleton_busy="refuse")
def report(ctx, n=0):
    return ctx.wait_for_signal("go")


def test_a_singleton_key_keeps_one_unfinished_run_and_a_second_start_gets_it():
    first = durable.start(sync_account, "acme", singleton="acme")
    second = durable.start(sync_account, "acme", n=2, singleton="acme")
    other = durable.start(sync_account, "globex", singleton="globex")
    assert second.pk == first.pk and second.created_now is False
    assert other.pk != first.pk
    assert WorkflowRun.objects.filter(workflow="tests.gates.sync_account").count() == 2
    drain()
    assert WorkflowRun.objects.get(pk=first.pk).get_result() == {"account": "acme", "n": 0}  # the first's input
    third = durable.start(sync_account, "acme", n=3, singleton="acme")  # the first has finished: a new run
    assert third.pk != first.pk and getattr(third, "created_now", True)


def test_the_admin_shows_a_runs_singleton_key(admin_client):
    run = durable.start(sync_account, "acme", singleton="acme:nightly")
    page = admin_client.get(f"/admin/django_durable/workflowrun/{run.pk}/change/").content.decode()
    assert "Singleton key" in page and "acme:nightly" in page


def test_a_workflow_may_refuse_a_second_singleton_start():
    held = durable.start(report, singleton="daily")
    drain()  # waiting for its signal: unfinished
    with pytest.raises(durable.SingletonBusy) as refused:
        durable.start(report, n=1, singleton="daily")
    assert refused.value.run_id == held.pk and "'daily'" in str(refused.value)
    assert isinstance(refused.value, durable.SubjectBusy)  # one except clause catches both


def test_debounce_starts_once_the_key_is_quiet_with_the_last_input():
    with clock() as now:
        first = durable.start(sync_account, "acme", n=1, debounce=("acme", 60))
        now.advance(seconds=30)
        second = durable.start(sync_account, "acme", n=2, debounce=("acme", 60))
        now.advance(seconds=50)  # 80 s after the first call, 50 s after the last: not quiet yet
        assert second.pk == first.pk and second.created_now is False
        assert drain() == 0
        third = durable.start(sync_account, "acme", n=3, debounce=("acme", 60))
        assert third.pk == first.pk
        timer = Timer.objects.get(run=first, kind="delayed_start")
        assert timer.fire_at == now.now + dt.timedelta(seconds=60)
        now.advance(seconds=59)
        assert drain() == 0
        now.advance(seconds=2)
        drain()
        run = WorkflowRun.objects.get(pk=first.pk)
        assert run.status == "completed" and run.get_result() == {"account": "acme", "n": 3}
        assert WorkflowRun.objects.filter(workflow="tests.gates.sync_account").count() == 1
        later = durable.start(sync_account, "acme", n=4, debounce=("acme", 60))  # it started: a new one
        assert later.pk != first.pk and later.status == "pending"


def test_throttle_delays_the_starts_beyond_its_limit_and_drops_none():
    with clock() as now:
        runs = [durable.start(sync_account, "acme", n=i, throttle=("acme", 2, 10)) for i in range(5)]
        due = [run.scheduled_at for run in runs]
        assert due[0] is None and due[1] is None  # the first two at once
        assert due[2:] == [now.now + dt.timedelta(seconds=10)] * 2 + [now.now + dt.timedelta(seconds=20)]
        assert drain() == 2
        now.advance(seconds=10)
        assert drain() == 2
        now.advance(seconds=10)
        assert drain() == 1
        assert sorted(r.get_result()["n"] for r in WorkflowRun.objects.filter(workflow="tests.gates.sync_account")) \
            == [0, 1, 2, 3, 4]


def test_bad_gates_are_refused_and_store_nothing():
    for options, message in [
        ({"singleton": ""}, "singleton is a string"),
        ({"debounce": ("k",)}, "debounce is \\(key, period\\)"),
        ({"debounce": ("k", 0)}, "more than 0 seconds"),
        ({"throttle": ("k", 0, 10)}, "limit is a number of starts"),
        ({"singleton": "k", "debounce": ("k", 1)}, "not singleton and debounce"),
        ({"debounce": ("k", 5), "delay": 3}, "give it or run_at/delay"),
        ({"singleton": "k", "idempotency_key": "i"}, "or an idempotency_key"),
    ]:
        with pytest.raises(ValueError, match=message):
            durable.start(sync_account, "acme", **options)
    assert not WorkflowRun.objects.exists() and not StartGate.objects.exists()
    with pytest.raises(ValueError, match="singleton_busy"):
        durable.workflow("tests.gates.bad", singleton_busy="wait")(lambda ctx: None)


def test_the_api_and_the_command_take_gates(admin_user):
    client = APIClient()
    client.force_authenticate(admin_user)
    body = {"workflow": "tests.gates.sync_account", "kwargs": {"account": "acme"}, "singleton": "acme"}
    first = client.post("/api/durable/workflows/", body, format="json")
    again = client.post("/api/durable/workflows/", body, format="json")
    assert (first.status_code, again.status_code) == (201, 200) and first.json()["id"] == again.json()["id"]
    debounced = client.post("/api/durable/workflows/", {"workflow": "tests.gates.sync_account", "kwargs": {
        "account": "b"}, "debounce": {"key": "b", "seconds": 30}}, format="json")
    assert debounced.status_code == 201 and debounced.json()["scheduled_at"] is not None
    throttled = client.post("/api/durable/workflows/", {"workflow": "tests.gates.sync_account", "kwargs": {
        "account": "c"}, "throttle": {"key": "c", "limit": 1, "seconds": 30}}, format="json")
    assert throttled.status_code == 201
    bad = client.post("/api/durable/workflows/", {**body, "throttle": {"key": "c", "limit": 0, "seconds": 1}},
                      format="json")
    assert bad.status_code == 400
    held = durable.start(report, singleton="weekly")
    refused = client.post("/api/durable/workflows/", {"workflow": "tests.gates.report", "singleton": "weekly"},
                          format="json")
    assert refused.status_code == 409 and str(held.pk) in refused.content.decode()

    out = io.StringIO()
    call_command("durable", "start", "tests.gates.sync_account", "--kwargs", '{"account": "acme"}',
                 "--singleton", "acme", "--json", stdout=out)
    assert json.loads(out.getvalue())["id"] == first.json()["id"]
    out = io.StringIO()
    call_command("durable", "start", "tests.gates.sync_account", "--kwargs", '{"account": "d"}',
                 "--debounce", "d", "30", "--json", stdout=out)
    out2 = io.StringIO()
    call_command("durable", "start", "tests.gates.sync_account", "--kwargs", '{"account": "d", "n": 9}',
                 "--debounce", "d", "30", "--json", stdout=out2)
    assert json.loads(out.getvalue())["id"] == json.loads(out2.getvalue())["id"]
    out = io.StringIO()
    call_command("durable", "start", "tests.gates.sync_account", "--kwargs", '{"account": "e"}',
                 "--throttle", "e", "1", "60", "--json", stdout=out)
    assert json.loads(out.getvalue())["status"] == "pending"


def producers(count: int, start) -> list:
    """Run start(i) in `count` threads at once (each its own connection); their results in order."""
    barrier, results = threading.Barrier(count), [None] * count

    def produce(i):
        barrier.wait(timeout=30)
        results[i] = start(i)

    assert in_threads(produce, count, timeout=60) == []
    return results


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_gates_are_exact_under_concurrent_producers():
    assert ON_POSTGRES
    rounds = 5
    for round in range(rounds):
        key = f"acme-{round}"
        singles = producers(12, lambda i: durable.start(sync_account, key, n=i, singleton=key).pk)
        assert len(set(singles)) == 1
        assert WorkflowRun.objects.filter(subject_lock=f"singleton:{key}").count() == 1

        # The key's row exists already (a key used before): the producers meet on its lock, not on its insert.
        StartGate.objects.create(workflow="tests.gates.sync_account", kind="debounce", key=f"d-{key}")
        bounced = producers(12, lambda i: durable.start(sync_account, key, n=i, debounce=(f"d-{key}", 60)).pk)
        assert len(set(bounced)) == 1
        held = WorkflowRun.objects.get(pk=bounced[0])
        assert held.status == "pending" and Timer.objects.filter(run=held, status="pending").count() == 1

        throttled = producers(12, lambda i: durable.start(sync_account, key, n=i, throttle=(f"t-{key}", 3, 60)))
        due = sorted((run.scheduled_at or run.created_at) for run in throttled)
        assert len({run.pk for run in throttled}) == 12  # none dropped
        ready_now = [run for run in throttled if run.scheduled_at is None]
        assert len(ready_now) == 3
        later = sorted(run.scheduled_at for run in throttled if run.scheduled_at is not None)
        # Every window of 60 s holds at most 3 starts: the 4th after the 1st by at least the period.
        assert all(later[i + 3] - later[i] >= dt.timedelta(seconds=60) for i in range(len(later) - 3))
        assert len(due) == 12


@pytest.mark.django_db(transaction=True)
def test_a_worker_process_runs_the_debounced_run_once_with_the_last_input(start_worker):
    from tests.conftest import wait_for

    worker = start_worker(burst=False)
    runs = [durable.start("tests.echo", n=i, debounce=("echo-key", 1.5)) for i in range(3)]
    assert len({run.pk for run in runs}) == 1
    wait_for(lambda: WorkflowRun.objects.get(pk=runs[0].pk).status == "completed", timeout=60,
             message="the debounced run")
    assert WorkflowRun.objects.get(pk=runs[0].pk).get_result() == {"args": [], "kwargs": {"n": 2}}
    assert WorkflowRun.objects.filter(workflow="tests.echo").count() == 1
    assert worker.running()
