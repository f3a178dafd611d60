"""The pytest plugin's fixtures, as a project using django-durable sees them."""

import pytest

import django_durable as durable

pytestmark = pytest.mark.django_db


def test_the_fixtures_move_time_and_drain_work(durable_clock, durable_drain):
    run = durable.start("tests.sleeper", 3600)
    durable_drain()
    run.refresh_from_db()
    assert run.status == "waiting"
    durable_clock.advance(hours=1)
    durable_drain()
    run.refresh_from_db()
    assert run.get_result() == ["before", "after"]


def test_the_plugin_is_registered_through_its_entry_point(pytestconfig):
    assert pytestconfig.pluginmanager.has_plugin("django_durable")


def test_durable_testing_is_reachable_from_the_package():
    with durable.testing.clock() as test_clock:
        assert durable.testing.clock is not None
        assert test_clock.now is not None
