"""DURABLE_DATABASE: the durable tables on a database of their own, beside the project's.

Two real databases (two PostgreSQL databases on the test server, or two SQLite files), migrated
as a project would, with a real worker, the admin, the API and the command line (tests/harness/own_database.py
does it all in a process of its own, with tests.settings_own_database).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import ON_POSTGRES, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def two_databases(tmp_path: Path):
    """(project's URL, durable URL), made for the test and dropped after it."""
    if not ON_POSTGRES:
        yield f"sqlite:///{tmp_path / 'project.sqlite3'}", f"sqlite:///{tmp_path / 'durable.sqlite3'}"
        return
    import psycopg

    server = os.environ["DURABLE_TEST_DATABASE_URL"]
    names = [f"durable_own_{which}_{uuid.uuid4().hex[:8]}" for which in ("project", "runs")]
    with psycopg.connect(server, autocommit=True) as connection:
        for name in names:
            connection.execute(f'CREATE DATABASE "{name}"')
    try:
        parts = urlsplit(server)
        yield tuple(urlunsplit(parts._replace(path=f"/{name}")) for name in names)
    finally:
        with psycopg.connect(server, autocommit=True) as connection:
            for name in names:
                connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_durable_tables_on_a_database_of_their_own(two_databases, tmp_path):
    project, runs = two_databases
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings_own_database", "DURABLE_OWN_APP_URL": project,
           "DURABLE_OWN_RUNS_URL": runs, "DURABLE_TEST_LEDGER": str(tmp_path / "ledger")}
    env.pop("DURABLE_TEST_DB_NAME", None)
    done = subprocess.run([sys.executable, "-m", "tests.harness.own_database"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    held = [line.removeprefix("ok: ") for line in done.stdout.splitlines() if line.startswith("ok: ")]
    assert len(held) == 9, done.stdout
