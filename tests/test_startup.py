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
