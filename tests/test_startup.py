"""A worker's start holds the cyclic collector off; nothing else does."""

import gc
import sys

import pytest

from django_durable import startup


@pytest.fixture
def collector():
    was = gc.isenabled()
    yield
    startup._held = False
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
