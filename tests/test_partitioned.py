"""The journal partitioned by time (partitioning.py): on PostgreSQL, a database made for the test
and tests/harness/partitioned.py in a process of its own with real workers; elsewhere, what a plain
journal answers.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_durable import partitioning
from tests.conftest import ROOT


def _in_own_database(module: str, tmp_path, **env) -> subprocess.CompletedProcess:
    """Run `module` in a process of its own, on a PostgreSQL database made for it and dropped after."""
    import psycopg

    server = os.environ["DURABLE_TEST_DATABASE_URL"]
    name = f"durable_partitioned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DURABLE_TEST_DB_NAME": name,
               "DURABLE_TEST_LEDGER": str(tmp_path / "ledger"), **env}
        return subprocess.run([sys.executable, "-m", module], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=240)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_a_partitioned_journal_through_conversion_workers_prune_and_drop(tmp_path):
    done = _in_own_database("tests.harness.partitioned", tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    held = [line for line in done.stdout.splitlines() if line.startswith("ok: ")]
    assert len(held) == 7, done.stdout


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_partitioned_runs_through_conversion_workers_keys_claims_and_a_dropped_month(tmp_path):
    stored = tmp_path / "stored"
    stored.mkdir()
    done = _in_own_database("tests.harness.partitioned_runs", tmp_path, DURABLE_TEST_OFFLOAD_DIR=str(stored))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    held = [line for line in done.stdout.splitlines() if line.startswith("ok: ")]
    assert len(held) == 12, done.stdout


@pytest.mark.django_db
def test_a_plain_journal_has_no_partitions_and_the_command_says_how_to_make_them():
    assert partitioning.layout(refresh=True) is None
    assert partitioning.partitions() == [] and partitioning.maintain() == {"made": [], "dropped": []}
    with pytest.raises(CommandError, match="plain table.*PartitionJournal"):
        call_command("durable", "partitions", stdout=io.StringIO())


@pytest.mark.django_db
def test_the_operation_does_nothing_off_postgresql_and_refuses_a_bad_interval():
    with pytest.raises(ValueError, match="interval must be one of day, week, month"):
        partitioning.PartitionJournal(interval="year")
    operation = partitioning.PartitionJournal(interval="week", ahead=2)
    assert operation.deconstruct() == ("PartitionJournal", [], {"interval": "week", "ahead": 2})
    if connection.vendor != "postgresql":
        operation.database_forwards("app", SimpleNamespace(connection=connection), None, None)
        assert partitioning.layout(refresh=True) is None
    with pytest.raises(NotImplementedError, match="not turned back"):
        operation.database_backwards("app", None, None, None)


@pytest.mark.django_db
def test_partitioning_the_runs_does_nothing_off_postgresql_and_refuses_bad_arguments():
    with pytest.raises(ValueError, match="interval must be one of day, week, month"):
        partitioning.PartitionRuns(interval="quarter")
    with pytest.raises(ValueError, match="ahead must be a whole number of intervals, at least 1"):
        partitioning.PartitionRuns(ahead=0)
    operation = partitioning.PartitionRuns(interval="week", ahead=2)
    assert operation.deconstruct() == ("PartitionRuns", [], {"interval": "week", "ahead": 2})
    assert (operation.describe(), operation.migration_name_fragment) == ("Partition the durable runs by week",
                                                                         "partition_runs")
    if connection.vendor != "postgresql":
        operation.database_forwards("app", SimpleNamespace(connection=connection), None, None)
        assert partitioning.runs.layout(refresh=True) is None
        with pytest.raises(NotImplementedError, match="Only a runs table on PostgreSQL"):
            partitioning.runs.convert(connection.alias)
    with pytest.raises(NotImplementedError, match="not turned back"):
        operation.database_backwards("app", None, None, None)
