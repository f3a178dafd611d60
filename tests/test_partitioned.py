"""The journal partitioned by time (partitioning.py): on PostgreSQL, a database made for the test
and tests/partitioned.py in a process of its own with real workers; elsewhere, what a plain
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


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_a_partitioned_journal_through_conversion_workers_prune_and_drop(tmp_path):
    import psycopg

    server = os.environ["DURABLE_TEST_DATABASE_URL"]
    name = f"durable_partitioned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DURABLE_TEST_DB_NAME": name,
               "DURABLE_TEST_LEDGER": str(tmp_path / "ledger")}
        done = subprocess.run([sys.executable, "-m", "tests.partitioned"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=240)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    held = [line for line in done.stdout.splitlines() if line.startswith("ok: ")]
    assert len(held) == 7, done.stdout


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
