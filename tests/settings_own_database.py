"""tests.settings with the durable tables on a database of their own (tests/test_own_database.py).

DURABLE_OWN_APP_URL is the project's database, DURABLE_OWN_RUNS_URL the durable one: two real
PostgreSQL databases, or two SQLite files.
"""

import os

import environ

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": environ.Env.db_url_config(os.environ["DURABLE_OWN_APP_URL"]),
    "durable": environ.Env.db_url_config(os.environ["DURABLE_OWN_RUNS_URL"]),
}
for _database in DATABASES.values():
    if _database["ENGINE"].endswith("sqlite3"):
        _database["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "timeout": 30,
                                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"}
DURABLE_DATABASE = "durable"
DATABASE_ROUTERS = ["django_durable.routers.DurableRouter"]
