"""Schedules and delayed starts, with the test clock."""

import datetime as dt
import io
import signal
import threading

import pytest
from django.core.management import call_command
from django.db import connections

import django_durable as durable
from django_durable import schedules
from django_durable.models import Schedule, Timer, WorkflowRun
from django_durable.testing import clock, drain

pytestmark = pytest.mark.django_db(transaction=True)

UTC = dt.timezone.utc
MINUTE = dt.timedelta(minutes=1)


def at(*args):
    return dt.datetime(*args, tzinfo=UTC)


def future_minute():
    """A whole minute, a little in the future (the test clock only moves forward from now)."""
    now = dt.datetime.now(UTC)
    return now.replace(second=0, microsecond=0) + 2 * MINUTE


def scheduled_times(slug):
    return sorted(
        WorkflowRun.objects.filter(idempotency_key__startswith=f"schedule:{slug}:").values_list("scheduled_at", flat=True)
    )


# -- delayed start --------------------------------------------------------------------------------


def test_a_delayed_run_exists_at_once_and_starts_at_its_time():
    with clock() as test_clock:
        start = test_clock.now
        run = durable.start("tests.three_steps", x=1, delay=dt.timedelta(minutes=5))
        run = WorkflowRun.objects.get(pk=run.pk)
        assert run.status == "pending" and run.scheduled_at == start + 5 * MINUTE
        assert run.waiting_on.startswith("starts at ")
        assert drain() == 0
        test_clock.advance(minutes=4, seconds=59)
        assert drain() == 0
        test_clock.advance(seconds=1)
        assert drain() == 1
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.get_result() == [1, 2, 3] and run.started_at is not None
    later = durable.start("tests.three_steps", run_at=start + dt.timedelta(days=1))
    assert Timer.objects.get(run=later).fire_at == start + dt.timedelta(days=1)
    with pytest.raises(ValueError, match="run_at or delay, not both"):
        durable.start("tests.three_steps", run_at=start, delay=1)
    with pytest.raises(ValueError, match="aware datetime"):
        durable.start("tests.three_steps", run_at=dt.datetime(2030, 1, 1))


# -- schedules ------------------------------------------------------------------------------------


def test_cron_every_minute_for_an_hour_starts_one_run_per_fire_time():
    with clock(future_minute()) as test_clock:
        first = test_clock.now
        schedules.ensure_schedule("every-minute", "tests.tick", cron="* * * * *")
        for _ in range(60):
            test_clock.advance(minutes=1)
            drain()
    times = scheduled_times("every-minute")
    assert times == [first + i * MINUTE for i in range(1, 61)]
    assert WorkflowRun.objects.filter(status="completed").count() == 60
    schedule = schedules.get("every-minute")
    assert schedule.last_run.scheduled_at == times[-1]


def test_ensure_schedule_is_idempotent_and_race_free():
    ids = []

    def ensure():
        try:
            ids.append(schedules.ensure_schedule("shared", "tests.tick", interval=60).pk)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=ensure) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(ids)) == 1 and Schedule.objects.count() == 1


def test_ensure_schedule_updates_a_changed_definition():
    with clock(future_minute()) as test_clock:
        first = schedules.ensure_schedule("report", "tests.tick", cron="0 * * * *")
        assert first.next_fire_at.minute == 0
        again = schedules.ensure_schedule("report", "tests.tick", cron="0 * * * *")
        assert again.next_fire_at == first.next_fire_at and again.updated_at == first.updated_at
        changed = schedules.ensure_schedule("report", "tests.tick", cron="30 * * * *", kwargs={"label": "x"})
        assert changed.next_fire_at.minute == 30
        assert changed.kwargs == '{"label":"x"}'
        assert test_clock.now < changed.next_fire_at


def test_interval_pause_resume_update_remove_and_trigger():
    with clock(future_minute()) as test_clock:
        schedules.ensure_schedule("every-10s", "tests.tick", interval=dt.timedelta(seconds=10))
        for _ in range(3):
            test_clock.advance(seconds=10)
            drain()
        assert len(scheduled_times("every-10s")) == 3

        schedules.pause("every-10s")
        for _ in range(6):  # a minute paused: nothing starts
            test_clock.advance(seconds=10)
            drain()
        assert len(scheduled_times("every-10s")) == 3

        schedules.resume("every-10s")  # catch_up="none": the paused minute is not replayed
        test_clock.advance(seconds=10)
        drain()
        times = scheduled_times("every-10s")
        assert len(times) == 4 and times[-1] == test_clock.now

        schedules.update("every-10s", interval=60)
        test_clock.advance(seconds=30)
        drain()
        assert len(scheduled_times("every-10s")) == 4
        test_clock.advance(seconds=30)
        drain()
        assert len(scheduled_times("every-10s")) == 5

        triggered = schedules.trigger("every-10s")
        assert schedules.get("every-10s").last_run_id == triggered.pk
        drain()
        assert WorkflowRun.objects.get(pk=triggered.pk).status == "completed"

        assert schedules.remove("every-10s") is True
        assert schedules.remove("every-10s") is False
        test_clock.advance(minutes=5)
        drain()
        assert len(scheduled_times("every-10s")) == 5


def test_next_runs_lists_the_coming_fire_times_in_the_schedules_zone():
    with clock(at(2026, 11, 22, 12, 0)):
        schedule = schedules.ensure_schedule("weekday-mornings", "tests.tick", cron="0 9 * * mon-fri",
                                             timezone="Europe/Paris")
        runs = schedule.next_runs(5)
    assert [t.strftime("%a %d %H:%M %Z") for t in runs] == [
        "Mon 23 09:00 CET", "Tue 24 09:00 CET", "Wed 25 09:00 CET", "Thu 26 09:00 CET", "Fri 27 09:00 CET",
    ]


def test_daylight_saving_time_a_0230_job_runs_once_on_both_changes(settings):
    """Europe/Paris, 2026: the clock skips 02:00-03:00 on March 29 and repeats it on October 25."""
    settings.DURABLE_SCHEDULE_GRACE_SECONDS = 7200  # the clock moves by the hour here
    with clock(at(2026, 3, 27, 12, 0)) as test_clock:
        schedules.ensure_schedule("night", "tests.tick", cron="30 2 * * *", timezone="Europe/Paris")
        for _ in range(4 * 24):
            test_clock.advance(hours=1)
            drain()
        spring = scheduled_times("night")
        test_clock.set(at(2026, 10, 23, 12, 0))  # the months between are missed, and skipped
        for _ in range(4 * 24):
            test_clock.advance(hours=1)
            drain()
        autumn = [t for t in scheduled_times("night") if t.month == 10]
    paris = [t.astimezone(dt.timezone(dt.timedelta(0))) for t in spring]
    assert paris == [at(2026, 3, 28, 1, 30), at(2026, 3, 29, 1, 0), at(2026, 3, 30, 0, 30), at(2026, 3, 31, 0, 30)]
    # March 29: 02:30 does not exist; the job runs once, at 03:00 CEST (01:00 UTC).
    # October 25: 02:30 happens twice; the job runs once, at the first (00:30 UTC).
    assert autumn == [at(2026, 10, 24, 0, 30), at(2026, 10, 25, 0, 30), at(2026, 10, 26, 1, 30), at(2026, 10, 27, 1, 30)]


@pytest.mark.parametrize("policy, expected", [("none", 0), ("latest", 1), ("all", 5)])
def test_catch_up_after_a_three_hour_outage(settings, policy, expected):
    settings.DURABLE_MAX_CATCH_UP = 5
    start = future_minute()
    start += dt.timedelta(minutes=15 - start.minute % 10)  # xx:x5, so no fire time is due at the end
    with clock(start) as test_clock:
        schedules.ensure_schedule("ten-minutes", "tests.tick", cron="*/10 * * * *", catch_up=policy)
        test_clock.advance(hours=3)  # every worker was down
        drain()
        missed = scheduled_times("ten-minutes")
        assert len(missed) == expected
        if policy == "latest":
            assert test_clock.now - missed[0] < dt.timedelta(minutes=10)
        test_clock.set(schedules.get("ten-minutes").next_fire_at)  # back to normal: the next one runs
        drain()
        assert len(scheduled_times("ten-minutes")) == expected + 1


def test_overlap_skip_does_not_start_while_the_previous_run_is_unfinished():
    with clock(future_minute()) as test_clock:
        schedules.ensure_schedule("approvals", "tests.approval", interval=60, overlap="skip")
        test_clock.advance(minutes=1)
        drain()
        first = schedules.get("approvals").last_run
        assert first.status == "waiting"
        for _ in range(3):
            test_clock.advance(minutes=1)
            drain()
        assert WorkflowRun.objects.filter(workflow="tests.approval").count() == 1
        durable.signal(first.pk, "approved", "yes")
        drain()
        test_clock.advance(minutes=1)
        drain()
    assert WorkflowRun.objects.filter(workflow="tests.approval").count() == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"cron": "61 * * * *"}, "cron='61 * * * *', which is not a valid five-field cron expression"),
        ({"cron": "* * * *"}, "cron='* * * *'"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "timezone='Mars/Olympus', which is not a known time zone"),
        ({"cron": "0 3 * * *", "interval": 60}, "both cron='0 3 * * *' and interval=60"),
        ({}, "needs cron= or interval="),
        ({"interval": 0}, "interval=0; it must be a positive number"),
        ({"interval": 60, "overlap": "sometimes"}, "overlap='sometimes'"),
        ({"interval": 60, "catch_up": "maybe"}, "catch_up='maybe'"),
    ],
)
def test_invalid_schedules_are_refused_naming_the_value(options, message):
    with pytest.raises(schedules.ScheduleError) as info:
        schedules.ensure_schedule("bad", "tests.tick", **options)
    assert message in str(info.value)
    assert Schedule.objects.count() == 0


def test_unknown_workflows_and_bad_slugs_are_refused():
    with pytest.raises(durable.WorkflowNotFound):
        schedules.ensure_schedule("x", "no.such.workflow", interval=60)
    with pytest.raises(schedules.ScheduleError, match="slug 'has spaces' is not valid"):
        schedules.ensure_schedule("has spaces", "tests.tick", interval=60)


def test_schedules_declared_on_workflows_are_synced():
    call_command("durable", "schedules", "sync", stdout=io.StringIO())
    schedule = schedules.get("tests.nightly")
    assert (schedule.cron, schedule.timezone, schedule.declared) == ("0 3 * * *", "Europe/Paris", True)
    Schedule.objects.create(slug="gone", workflow="tests.gone", cron="0 3 * * *", declared=True)
    call_command("durable", "schedules", "sync", stdout=io.StringIO())
    assert not Schedule.objects.filter(slug="gone").exists()
    assert schedules.get("tests.nightly").pk == schedule.pk
    # An operator pauses a declared schedule: the next sync (every worker start) keeps it paused.
    schedules.pause("tests.nightly")
    call_command("durable", "schedules", "sync", stdout=io.StringIO())
    assert schedules.get("tests.nightly").status == "paused"


def test_durable_ensure_schedule_is_the_same_function():
    assert durable.ensure_schedule is schedules.ensure_schedule


@pytest.mark.postgres
def test_three_workers_racing_the_scheduler_start_each_fire_time_once(start_worker):
    import time

    workers = [start_worker(burst=False, env={"DURABLE_POLL_INTERVAL": "0.2"}) for _ in range(3)]
    schedules.ensure_schedule("every-second", "tests.tick", interval=1)
    # Ten fire times started, however long the workers took to start on a busy machine (bounded).
    deadline = time.monotonic() + 180
    while len(scheduled_times("every-second")) < 10 and time.monotonic() < deadline:
        time.sleep(0.5)
    schedules.pause("every-second")
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait() == 0, worker.log()
    times = scheduled_times("every-second")
    assert len(times) >= 10
    assert len(set(times)) == len(times)  # no fire time twice
    gaps = {b - a for a, b in zip(times, times[1:])}
    assert gaps == {dt.timedelta(seconds=1)}  # none missed either
    # (How late a fire time starts measures the machine: bench/, not here.)


def test_starting_a_fire_time_twice_makes_one_run():
    with clock(future_minute()) as test_clock:
        schedule = schedules.ensure_schedule("twice", "tests.tick", interval=60)
        fire_time = test_clock.now + MINUTE
        schedules._start_runs([(schedule, fire_time)], "default")
        schedules._start_runs([(schedule, fire_time)], "default")  # another worker, or a retry after a crash
    assert scheduled_times("twice") == [fire_time]
    assert WorkflowRun.objects.get().work_items.count() == 1
