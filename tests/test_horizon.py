"""What holds PostgreSQL's cleanup horizon back, told to the operator (django_durable.horizon): a
session that holds a snapshot, idle in its transaction, and a forgotten prepared transaction, each
named with who holds it by `durable health`, `durable stats`, the metrics and the admin's overview;
nothing held, nothing said."""

from __future__ import annotations

import contextlib
import io

import pytest
from django.core.management import call_command
from django.db import connection

from django_durable import health, horizon, stats
from django_durable.models import WorkflowRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@contextlib.contextmanager
def session(**options):
    """A second session of the test's database, as an analytics client would open it."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, application_name="analytics", **options) as other:
        yield other


@pytest.mark.postgres
def test_a_session_idle_in_a_repeatable_read_transaction_is_named_with_who_holds_it(settings, admin_client):
    with session() as analytics:
        analytics.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        analytics.execute(f"SELECT count(*) FROM {WorkflowRun._meta.db_table}")  # its snapshot, kept to the end
        pid = analytics.info.backend_pid
        [holder] = [found for found in horizon.holders() if found.pid == pid]
        assert (holder.kind, holder.name, holder.state, holder.idle_in_transaction) == (
            "snapshot", "analytics", "idle in transaction", True)
        assert holder.seconds is not None and holder.seconds >= 0 and holder.since is not None

        settings.DURABLE_HEALTH_MAX_HORIZON_SECONDS = 3600  # held, not yet for long
        assert health.report()["checks"][-1]["ok"]
        settings.DURABLE_HEALTH_MAX_HORIZON_SECONDS = 0  # now too long
        data = health.report()
        check = data["checks"][-1]
        assert not data["ok"] and check["name"] == "horizon" and not check["ok"]
        assert f"a session idle in transaction (pid {pid}, 'analytics'" in check["detail"], check["detail"]

        assert any(found["pid"] == pid and found["kind"] == "snapshot" for found in stats.summary()["horizon"])
        out = io.StringIO()
        call_command("durable", "stats", stdout=out)
        assert "VACUUM's horizon is held by " in out.getvalue()
        page = admin_client.get("/admin/django_durable/overview/").content.decode()
        assert 'id="durable-horizon"' in page and f"pid {pid}" in page
        metrics = admin_client.get("/durable/metrics/").content.decode()
        assert 'durable_horizon_age_seconds{kind="snapshot"}' in metrics
    assert not [found for found in horizon.holders() if found.pid == pid]  # released
    assert health.horizon_check().ok
    assert 'id="durable-horizon"' not in admin_client.get("/admin/django_durable/overview/").content.decode()


@pytest.mark.postgres
def test_a_forgotten_prepared_transaction_is_named(settings):
    with session(autocommit=True) as other:
        if other.execute("SHOW max_prepared_transactions").fetchone()[0] == "0":
            pytest.fail("the test server allows no prepared transaction: scripts/pg-server.sh sets max_prepared_transactions")
        other.execute("BEGIN")
        other.execute("SELECT txid_current()")  # a transaction id, which the prepared transaction keeps
        other.execute("PREPARE TRANSACTION 'durable-test-forgotten'")
        try:
            [holder] = [found for found in horizon.holders(limit=20) if found.kind == "prepared"]
            assert holder.name == "durable-test-forgotten" and holder.seconds is not None
            settings.DURABLE_HEALTH_MAX_HORIZON_SECONDS = 0
            check = health.horizon_check()
            assert not check.ok and "the prepared transaction 'durable-test-forgotten'" in check.detail
        finally:
            other.execute("ROLLBACK PREPARED 'durable-test-forgotten'")
    assert not [found for found in horizon.holders(limit=20) if found.kind == "prepared"]


def test_nothing_is_said_where_nothing_holds_it_or_the_database_is_not_postgresql(settings):
    settings.DURABLE_HEALTH_MAX_HORIZON_SECONDS = 0
    check = health.horizon_check()
    assert check.ok, check.detail
    if connection.vendor != "postgresql":
        assert horizon.holders() == [] and check.detail == "not PostgreSQL"


def test_a_holder_is_late_by_its_time_or_where_no_time_is_known_by_its_transactions():
    timed = horizon.Holder("snapshot", 1, "a", "u", "local", "active", None, 10.0, 5)
    slot = horizon.Holder("slot", None, "s", "physical", "inactive", "", None, None, 2_000)
    assert horizon.held_too_long([timed, slot], max_seconds=20, max_transactions=1_000) == [slot]
    assert horizon.held_too_long([timed, slot], max_seconds=5, max_transactions=10_000) == [timed]
    assert slot.describe() == "the inactive replication slot 's' (physical) 2000 transactions old"
