"""Queues with limits (DURABLE_QUEUES): concurrency, per-key concurrency and rate, across workers."""

from __future__ import annotations

import datetime as dt
import json
import signal
import time

import pytest
from django.core.checks import run_checks
from django.test import override_settings

import django_durable as durable
from django_durable import workpool
from django_durable.models import QueueState, WorkflowRun, WorkItem
from django_durable.queues import parse, parse_rate
from tests.conftest import assert_settled
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)


# -- the setting ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("10/s", (10, 1.0)), ("100/min", (100, 60.0)), ("5/10s", (5, 10.0)), ("1000/hour", (1000, 3600.0)),
    ("3/day", (3, 86400.0)), ("2 / 30 seconds", (2, 30.0)),
])
def test_rate_limits_are_read_as_claims_per_period(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("setting, message", [
    ({"emails": {"concurrency": 0}}, "DURABLE_QUEUES['emails']['concurrency'] must be a positive integer, not 0."),
    ({"emails": {"concurrency": "5"}}, "must be a positive integer, not '5'"),
    ({"emails": {"rate_limit": "10 per second"}}, "DURABLE_QUEUES['emails']['rate_limit']: A rate limit is written"),
    ({"emails": {"rate_limit": "0/s"}}, "positive number of claims"),
    ({"emails": {"concurency": 5}},
     "has 'concurency', which is not a setting of a queue; use concurrency, key_concurrency, rate_limit, fairness."),
    ({"emails": {"fairness": "yes"}}, "['fairness'] must be True, False or {'weights': {key: weight}}, not 'yes'."),
    ({"emails": {"fairness": {"weight": {}}}}, "['fairness'] must be True, False or {'weights'"),
    ({"emails": {"fairness": {"weights": {"acme": 0}}}}, "['fairness']['weights']['acme'] must be an integer from 1"),
    ({"emails": {"fairness": {"weights": ["acme"]}}}, "['weights'] must be a dict of concurrency keys to weights"),
    ({"emails": 5}, "DURABLE_QUEUES['emails'] must be a dict"),
    (["emails"], "must be a dict of queue names"),
])
def test_a_wrong_setting_is_refused_with_what_is_wrong(setting, message):
    with pytest.raises(ValueError, match=None) as raised:
        parse(setting)
    assert message in str(raised.value)
    with override_settings(DURABLE_QUEUES=setting):
        errors = [e for e in run_checks() if e.id == "django_durable.E007"]
    assert len(errors) == 1 and message in errors[0].msg


# -- the claim, in one process ----------------------------------------------------------------


def _claim(name="w"):
    return workpool.claim(worker=name, queues=None, db="default")


def _finish(claim):
    assert workpool.finish_run(claim, status="completed", result="null", error=None) == "completed"


@override_settings(DURABLE_QUEUES={"emails": {"concurrency": 2}})
def test_a_full_queue_is_skipped_and_other_queues_go_on():
    emails = [durable.start("tests.echo", n, queue="emails") for n in range(3)]
    other = durable.start("tests.echo", "x")
    first, second = _claim(), _claim()
    assert {first.run_id, second.run_id} == {emails[0].pk, emails[1].pk}
    third = _claim()
    assert third.run_id == other.pk  # the third email waits for a slot; the other queue does not
    assert _claim() is None
    assert workpool.held_back(queues=None, db="default")
    _finish(first)
    fourth = _claim()
    assert fourth.run_id == emails[2].pk
    assert not workpool.held_back(queues=None, db="default")


@override_settings(DURABLE_QUEUES={"emails": {"concurrency": 1}}, DURABLE_POLL_INTERVAL=5.0)
def test_a_worker_looks_again_soon_while_a_limit_holds_ready_work_back():
    from django_durable.worker import LIMITED_POLL, Worker

    worker = Worker(name="w")
    assert worker._idle_seconds() == 5.0  # nothing held back: the poll interval
    durable.start("tests.echo", 1, queue="emails")
    durable.start("tests.echo", 2, queue="emails")
    assert _claim() is not None
    assert worker._idle_seconds() == LIMITED_POLL  # the second waits for the slot, not for 5 s
    assert Worker(name="x", queues=["default"])._idle_seconds() == 5.0  # not its queue


@pytest.mark.postgres  # on SQLite the worker claims next with a statement of its own
@override_settings(DURABLE_QUEUES={"emails": {"concurrency": 2}})
def test_a_finished_item_frees_its_slot_for_the_claim_in_the_same_statement():
    emails = [durable.start("tests.echo", n, queue="emails") for n in range(3)]
    first, second = _claim(), _claim()
    assert workpool.finish_run(first, status="completed", result="null", error=None,
                               then=workpool.ClaimRequest("w", None)) == "completed"
    assert first.next_claim is not None and first.next_claim.run_id == emails[2].pk
    assert WorkItem.objects.filter(status="processing").count() == 2
    assert second.run_id == emails[1].pk


@override_settings(DURABLE_QUEUES={"reports": {"key_concurrency": 1}})
def test_one_key_takes_one_slot_and_other_keys_are_not_held_behind_it():
    a = [durable.start("tests.echo", n, queue="reports", concurrency_key="tenant:a") for n in range(3)]
    b = durable.start("tests.echo", "b", queue="reports", concurrency_key="tenant:b")
    free = durable.start("tests.echo", "no key", queue="reports")
    claims = [_claim(), _claim(), _claim()]
    assert [c.run_id for c in claims] == [a[0].pk, b.pk, free.pk]
    assert _claim() is None
    _finish(claims[0])
    assert _claim().run_id == a[1].pk
    assert WorkflowRun.objects.get(pk=a[2].pk).concurrency_key == "tenant:a"


@override_settings(DURABLE_QUEUES={"api": {"rate_limit": "1/hour"}})
def test_a_rate_limit_spaces_the_claims_of_its_queue():
    runs = [durable.start("tests.echo", n, queue="api") for n in range(2)]
    first = _claim()
    assert first.run_id == runs[0].pk
    _finish(first)
    assert _claim() is None  # the next claim of "api" is an hour away
    state = QueueState.objects.get(name="api")
    assert 3500 < (state.next_claim_at - WorkflowRun.objects.get(pk=runs[0].pk).started_at).total_seconds() < 3601
    QueueState.objects.filter(name="api").update(next_claim_at=state.next_claim_at.replace(year=2000))
    assert _claim().run_id == runs[1].pk


@override_settings(DURABLE_QUEUES={"emails": {"concurrency": 1}})
def test_parallel_branches_and_start_many_count_against_their_queue():
    ids = durable.start_many("tests.echo", [[1], [2]], queue="emails", concurrency_key="k")
    assert set(WorkItem.objects.filter(run_id__in=ids).values_list("queue", "concurrency_key")) == {("emails", "k")}
    first = _claim()
    assert first is not None and _claim() is None


def test_a_bad_concurrency_key_is_refused_before_anything_is_stored():
    with pytest.raises(ValueError, match="concurrency_key must be a string of 1 to 200 characters"):
        durable.start("tests.echo", 1, concurrency_key="")
    assert not WorkflowRun.objects.exists()


# -- worker processes -------------------------------------------------------------------------


def _executions() -> dict[str, tuple[float, float, int]]:
    """{run id: (start, end, pid)} of every execution of tests.timed, from the ledger."""
    starts, ends = {}, {}
    for run, step, pid in ledger.entries():
        kind, _, at = step.partition(":")
        if kind == "start":
            starts[run] = (float(at), pid)
        else:
            ends[run] = float(at)
    return {run: (start, ends[run], pid) for run, (start, pid) in starts.items()}


def _most_at_once(spans) -> int:
    events = sorted([(start, 1) for start, _, _ in spans] + [(end, -1) for _, end, _ in spans],
                    key=lambda e: (e[0], e[1]))  # an end at the same instant as a start frees first
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def _stop(workers) -> None:
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, worker.log()


LIMITS = {"emails": {"concurrency": 2}, "tenants": {"key_concurrency": 1}, "api": {"rate_limit": "10/s"}}
WORKER_ENV = {"DURABLE_TEST_QUEUES": json.dumps(LIMITS)}


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(240)
@override_settings(DURABLE_QUEUES=LIMITS)
def test_concurrency_two_across_four_worker_processes_never_runs_three(start_worker):
    durable.start_many("tests.timed", [[0.02]] * 200, queue="emails")
    workers = [start_worker(env=WORKER_ENV) for _ in range(4)]
    for worker in workers:
        assert worker.wait(200) == 0, worker.log()
    spans = list(_executions().values())
    assert len(spans) == 200
    assert _most_at_once(spans) == 2  # never 3; and the limit was reached, not merely respected
    assert len({pid for _, _, pid in spans}) > 1  # the workers shared the queue
    assert_settled()


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(240)
@override_settings(DURABLE_QUEUES=LIMITS)
def test_one_tenants_backlog_does_not_hold_back_another_tenant(start_worker):
    big = durable.start_many("tests.timed", [[0.05]] * 1000, queue="tenants", concurrency_key="tenant:big")
    small = durable.start_many("tests.timed", [[0.0]] * 10, queue="tenants", concurrency_key="tenant:small")
    workers = [start_worker(burst=False, env=WORKER_ENV) for _ in range(2)]
    for run_id in small:
        durable.wait(run_id, timeout=60)
    big_done = WorkflowRun.objects.filter(pk__in=big, status="completed").count()
    _stop(workers)
    # tenant:big runs one at a time, 0.05 s each: by the time the 10 of tenant:small (enqueued
    # after all 1,000) finished, it had got through a small part of its backlog.
    assert big_done < 500, big_done
    executions = _executions()
    assert _most_at_once([executions[str(run)] for run in big if str(run) in executions]) == 1


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(240)
@override_settings(DURABLE_QUEUES=LIMITS)
def test_a_rate_of_ten_a_second_holds_across_workers(start_worker):
    ids = durable.start_many("tests.timed", [[0.0]] * 200, queue="api")
    workers = [start_worker(burst=False, env=WORKER_ENV) for _ in range(3)]
    # Until more have been claimed than the rate allows in a window (however long the workers
    # took to start on a busy machine), bounded.
    started = WorkflowRun.objects.filter(pk__in=ids, started_at__isnull=False)
    deadline = time.monotonic() + 180
    while started.count() < 70 and time.monotonic() < deadline:
        time.sleep(0.5)
    _stop(workers)
    # A one-step run is claimed once; its started_at is that claim's time, on the database's clock.
    claims = sorted(started.values_list("started_at", flat=True))
    assert len(claims) >= 70, len(claims)
    window = dt.timedelta(seconds=5)
    most = max(sum(1 for t in claims if first <= t < first + window) for first in claims)
    assert most <= 51, most
    gaps = [(b - a).total_seconds() for a, b in zip(claims, claims[1:])]
    assert min(gaps) >= 0.099, min(gaps)


@override_settings(DURABLE_QUEUES={"emails": {"concurrency": 1, "rate_limit": "100/min"}, "idle": {"key_concurrency": 2}})
def test_the_overview_shows_each_queues_limits_and_how_full_it_is(admin_client):
    for n in range(3):
        durable.start("tests.echo", n, queue="emails")
    assert _claim() is not None
    page = admin_client.get("/admin/django_durable/overview/").content.decode()
    table = page[page.index('id="durable-queue-lag"'):].split("</table>")[0]
    rows = {row.split("</td>")[0].rsplit(">", 1)[-1]: row for row in table.split("<tr>")[2:]}
    assert "<td>2</td>" in rows["emails"] and "1 <strong>(full)</strong>" in rows["emails"]
    assert "1 at once, 100 per 60 s" in rows["emails"]
    assert "2 per key" in rows["idle"] and "(full)" not in rows["idle"]
