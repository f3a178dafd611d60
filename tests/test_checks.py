"""System checks: the settings and database options django-durable needs."""

import os

import pytest
from django.core import checks

from django_durable import checks as durable_checks


def ids(messages):
    return sorted(m.id for m in messages)


def test_the_test_settings_pass():
    assert durable_checks.check_settings() == []


def test_use_tz_is_required(settings):
    settings.USE_TZ = False
    assert "django_durable.E001" in ids(durable_checks.check_settings())


def test_an_unknown_database_alias(settings):
    settings.DURABLE_DATABASE = "nope"
    assert ids(durable_checks.check_settings()) == ["django_durable.E002"]


def test_unsupported_database_engine(settings):
    with pytest.warns(UserWarning, match="Overriding setting DATABASES"):
        settings.DATABASES = {**settings.DATABASES, "default": {"ENGINE": "django.db.backends.mysql"}}
    assert "django_durable.E003" in ids(durable_checks.check_settings())


@pytest.mark.parametrize("name, value", [("LEASE_SECONDS", 0), ("POLL_INTERVAL", "1"), ("MAX_DELIVERIES", -1)])
def test_timing_settings_must_be_positive_numbers(settings, name, value):
    setattr(settings, f"DURABLE_{name}", value)
    messages = durable_checks.check_settings()
    assert "django_durable.E004" in ids(messages)
    assert repr(value) in " ".join(m.msg for m in messages)


def test_heartbeat_must_fit_in_the_lease(settings):
    settings.DURABLE_LEASE_SECONDS = 10
    settings.DURABLE_HEARTBEAT_SECONDS = 6
    assert ids(durable_checks.check_settings()) == ["django_durable.E005"]


def test_sqlite_without_immediate_transactions_is_warned(settings):
    default = dict(settings.DATABASES["default"])
    if not default["ENGINE"].endswith("sqlite3"):
        pytest.skip("SQLite only")
    default["OPTIONS"] = {}
    with pytest.warns(UserWarning, match="Overriding setting DATABASES"):
        settings.DATABASES = {**settings.DATABASES, "default": default}
    messages = durable_checks.check_settings()
    assert ids(messages) == ["django_durable.W001"]
    assert "transaction_mode" in messages[0].hint


@pytest.mark.django_db
def test_sqlite_outside_wal_mode_is_warned(tmp_path, monkeypatch):
    from django.db.backends.sqlite3.base import DatabaseWrapper

    wrapper = DatabaseWrapper({
        "ENGINE": "django.db.backends.sqlite3", "NAME": str(tmp_path / "plain.sqlite3"), "OPTIONS": {},
        "TIME_ZONE": None, "CONN_MAX_AGE": 0, "CONN_HEALTH_CHECKS": False, "AUTOCOMMIT": True,
        "ATOMIC_REQUESTS": False, "USER": "", "PASSWORD": "", "HOST": "", "PORT": "", "TEST": {},
    })
    monkeypatch.setattr(durable_checks, "connections", {"default": wrapper})
    try:
        messages = durable_checks.check_sqlite_journal(databases=["default"])
        assert ids(messages) == ["django_durable.W002"]
        assert "'delete'" in messages[0].msg and "journal_mode=WAL" in messages[0].hint
        with wrapper.cursor() as cursor:
            cursor.execute("PRAGMA journal_mode=WAL")
        assert durable_checks.check_sqlite_journal(databases=["default"]) == []
        assert durable_checks.check_sqlite_journal(databases=None) == []  # only when asked
    finally:
        wrapper.close()


def test_checks_are_registered():
    registered = checks.registry.registry.get_checks(include_deployment_checks=False)
    assert durable_checks.check_settings in registered


@pytest.mark.django_db
@pytest.mark.parametrize("value", [{"max_attempts": 0}, {"bogus": 1}, "3 attempts", {"initial_backoff": -1}])
def test_a_bad_default_retry_policy_is_an_error_at_start_up(settings, value):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    settings.DURABLE_DEFAULT_RETRY = value
    errors = [e for e in durable_checks.check_settings() if e.id == "django_durable.E006"]
    assert len(errors) == 1 and "DURABLE_DEFAULT_RETRY" in errors[0].msg
    with pytest.raises(SystemCheckError, match="E006"):
        call_command("durable_worker", "--burst", "-c", "1", skip_checks=False)  # the worker refuses to start


def test_a_good_default_retry_policy_passes(settings):
    import django_durable as durable

    for value in (None, {"max_attempts": 5, "initial_backoff": 0.5}, durable.RetryPolicy(max_attempts=2)):
        settings.DURABLE_DEFAULT_RETRY = value
        assert [e for e in durable_checks.check_settings() if e.id == "django_durable.E006"] == []


@pytest.mark.parametrize("alias", ["nowhere", "default"])
def test_the_listening_database_must_be_a_postgresql_alias(settings, alias):
    """DURABLE_LISTEN_DATABASE (the sessions that LISTEN around a transaction pooler)."""
    settings.DURABLE_LISTEN_DATABASE = alias
    engine = settings.DATABASES["default"]["ENGINE"]
    refused = alias == "nowhere" or not engine.endswith("postgresql")
    assert ("django_durable.E012" in ids(durable_checks.check_settings())) == refused


def test_a_worker_runs_its_own_checks_without_loading_the_projects_urls(tmp_path):
    """The project's URLs (and with them the REST framework and the API's views) are for the web
    processes: a worker that loaded them for the URL checks started twice as slowly. Nor does
    Django's start import croniter: it waits for a schedule to need it (here the worker's sync of
    the declared schedules, beside its first claims)."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = """
import sys, django
django.setup()
print("croniter" in sys.modules)
from django.conf import settings
if sys.argv[1:] == ["bad"]:
    settings.DURABLE_DEFAULT_RETRY = "3 attempts"
from django.core.management import call_command
call_command("migrate", verbosity=0)
try:
    call_command("durable_worker", "--burst", "-c", "1", "-v", "0", skip_checks=False)
except SystemExit:
    pass
print(sorted(name for name in ("rest_framework.routers", "django_durable.api.views", "django_durable.urls")
             if name in sys.modules))
"""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "DURABLE_TEST_SQLITE_PATH": str(tmp_path / "worker.sqlite3")}
    env.pop("DURABLE_TEST_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
    assert done.stdout.strip().splitlines()[0] == "False", done.stdout
    # Its own checks still run: a bad setting stops it.
    bad = subprocess.run([sys.executable, "-c", code, "bad"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "django_durable.E006" in bad.stderr, bad.stderr[-3000:]
