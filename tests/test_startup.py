"""A worker's start holds the cyclic collector off; nothing else does."""

import gc
import sys

import pytest

from django_durable import startup


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    startup.release_collector()  # whatever a test left held
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("argv, held", [
    (["manage.py", "durable_worker", "-c", "2"], True),
    (["/venv/bin/django-admin", "durable_worker"], True),
    (["manage.py", "runserver"], False),
    (["gunicorn", "project.wsgi"], False),
    (["manage.py"], False),
])
def test_only_a_worker_start_holds_the_collector_off(collector, monkeypatch, argv, held):
    monkeypatch.setattr(sys, "argv", argv)
    gc.enable()
    startup.hold_collector()
    assert gc.isenabled() is not held
    startup.release_collector()
    assert gc.isenabled()


def test_a_collector_the_project_turned_off_stays_off(collector, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["manage.py", "durable_worker"])
    gc.disable()
    startup.hold_collector()
    startup.release_collector()
    assert not gc.isenabled()


def test_a_reloading_worker_turns_the_collector_on_before_it_watches_files(collector, monkeypatch):
    """With --reload the process only watches files, as long as the developer works: it must not
    stay without its collector (its workers are processes of their own, which hold it again)."""
    from django.core.management import call_command

    from django_durable.worker import reloader

    class Watching:
        collecting = None

        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            Watching.collecting = gc.isenabled()
            return 0

    monkeypatch.setattr(reloader, "Reloader", Watching)
    monkeypatch.setattr(sys, "argv", ["manage.py", "durable_worker", "--reload"])
    gc.enable()
    startup.hold_collector()
    assert not gc.isenabled()
    with pytest.raises(SystemExit):
        call_command("durable_worker", reload=True, skip_checks=True, verbosity=0)
    assert Watching.collecting is True


SERVING = ["django_durable.admin", "rest_framework", "django.contrib.sessions.models"]
try:  # on Django 5.2 the django-tasks backport itself imports the admin (through django-stubs-ext)
    import django.tasks  # noqa: F401

    SERVING.append("django.contrib.admin")
except ImportError:
    pass


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("settings_module, serving", [("tests.settings", SERVING), ("tests.settings_worker", [])])
def test_a_worker_started_with_settings_of_its_own_leaves_the_serving_apps_out(start_worker, settings_module,
                                                                               serving):
    """docs/workers.md: a worker started with the project's settings less the apps that only serve
    requests runs tasks and workflows as any other, and never imports those apps; with the
    project's own settings it sets them all up (what the worker's settings save)."""
    import django_durable as durable
    from django_durable.models import WorkflowRun
    from tests.testapp.tasks import imported

    result = imported.enqueue(*SERVING)
    run = durable.start("tests.three_steps", x=1)
    worker = start_worker("--settings", settings_module)
    assert worker.wait() == 0, worker.log()
    result.refresh()
    assert result.return_value == serving
    run.refresh_from_db()
    assert (run.status, run.get_result()) == (WorkflowRun.Status.COMPLETED, [1, 2, 3])


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(90)
@pytest.mark.parametrize("first_claim_wait, patience, order", [
    (60.0, 1.0, ["claim", "sync"]),  # however long the first claim takes here, it goes first
    (0.05, 30.0, ["sync", "claim"]),  # a first claim held up holds the maintenance thread up no longer than the wait
])
def test_a_worker_tries_its_first_claim_before_its_maintenance_thread_starts_its_own_work(
        monkeypatch, first_claim_wait, patience, order):
    """The maintenance thread's start (the declared schedules, the worker's row, the reaper, due
    timers) waits for the main thread's first claim, at most FIRST_CLAIM_WAIT: at a start, the
    slowest moment of a worker's life, its queries would compete with that claim for the
    interpreter, the cores and the database."""
    import threading

    from django_durable import schedules
    from django_durable.worker import maintenance
    from django_durable.worker.process import Worker
    from tests.testapp.tasks import noop

    monkeypatch.setattr(maintenance, "FIRST_CLAIM_WAIT", first_claim_wait)
    events, synced = [], threading.Event()
    sync, take = schedules.sync_declared, Worker._take

    def syncing(*args, **kwargs):
        events.append("sync")
        synced.set()
        return sync(*args, **kwargs)

    def taking(self):
        if "claim" not in events:  # the first claim waits for the sync, up to its patience
            synced.wait(patience)
            events.append("claim")
        return take(self)

    monkeypatch.setattr(schedules, "sync_declared", syncing)
    monkeypatch.setattr(Worker, "_take", taking)
    result = noop.enqueue()
    assert Worker(burst=True, name="w-first").run() == 0
    assert events[:2] == order
    result.refresh()
    assert result.status == "SUCCESSFUL"
