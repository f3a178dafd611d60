"""Settings of the test suite: SQLite by default, PostgreSQL when DURABLE_TEST_DATABASE_URL is set.

Worker subprocesses started by the tests use these settings too, with DURABLE_TEST_DB_NAME
pointing them at the test database the test run created.
"""

import json
import os
import tempfile
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "tests-only"
DEBUG = os.environ.get("DURABLE_TEST_DEBUG") == "1"  # a worker as `runserver` projects run it (test_quiet_logs)
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_durable",
    "tests.testapp",
    "example_project.orders",
    "example_project.examples",
]
# django.tasks on Django 6; the django-tasks backport (an app of its own) on Django 5.2.
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
TASKS = {"default": {"BACKEND": "django_durable.tasks.DurableBackend",
                     "QUEUES": ["default", "emails", "slow"]},
         # Issue 30: a project whose other tasks go elsewhere routes some to durable workers by name.
         "durable": {"BACKEND": "django_durable.tasks.DurableBackend"},
         "elsewhere": {"BACKEND": ("django.tasks.backends.immediate.ImmediateBackend" if "django_tasks" not in INSTALLED_APPS
                                   else "django_tasks.backends.immediate.ImmediateBackend")}}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_url = os.environ.get("DURABLE_TEST_DATABASE_URL")
if _url:
    DATABASES = {"default": environ.Env.db_url_config(_url)}
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("DURABLE_TEST_DB_NAME", "test_durable")}
else:
    # A file, not :memory:, so that worker subprocesses see the same database.
    _path = os.environ.get("DURABLE_TEST_SQLITE_PATH") or os.path.join(tempfile.gettempdir(), f"durable-test-{os.getpid()}.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _path,
            "TEST": {"NAME": _path},
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
if os.environ.get("DURABLE_TEST_DB_NAME"):
    # A worker subprocess: connect straight to the database the test run created.
    DATABASES["default"]["NAME"] = os.environ["DURABLE_TEST_DB_NAME"]
if os.environ.get("DURABLE_TEST_HOSTS"):
    # A primary and its standby (tests/harness/failover.py): "host:port,host:port", whichever
    # accepts writes (libpq's multi-host connection string).
    _hosts = [h.rsplit(":", 1) for h in os.environ["DURABLE_TEST_HOSTS"].split(",")]
    DATABASES["default"].update(HOST=",".join(h for h, _ in _hosts), PORT=",".join(p for _, p in _hosts))
    DATABASES["default"].setdefault("OPTIONS", {})["target_session_attrs"] = "read-write"
if os.environ.get("DURABLE_TEST_DIRECT_URL"):
    # DURABLE_TEST_DATABASE_URL goes through a transaction pooler (tests/harness/pooler.py): the
    # listening sessions reach the same database directly.
    DATABASES["direct"] = {**environ.Env.db_url_config(os.environ["DURABLE_TEST_DIRECT_URL"]),
                           "NAME": DATABASES["default"]["NAME"], "TEST": {"MIRROR": "default"}}
    DURABLE_LISTEN_DATABASE = "direct"

if os.environ.get("DURABLE_TEST_QUEUES"):  # a worker subprocess of a test with DURABLE_QUEUES (JSON)
    DURABLE_QUEUES = json.loads(os.environ["DURABLE_TEST_QUEUES"])

DURABLE_LEASE_SECONDS = float(os.environ.get("DURABLE_LEASE_SECONDS", 30))
DURABLE_HEARTBEAT_SECONDS = float(os.environ.get("DURABLE_HEARTBEAT_SECONDS", 10))
DURABLE_REAPER_INTERVAL = float(os.environ.get("DURABLE_REAPER_INTERVAL", 10))
DURABLE_POLL_INTERVAL = float(os.environ.get("DURABLE_POLL_INTERVAL", 0.2))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_durable": {"handlers": ["console"], "level": os.environ.get("DURABLE_LOG_LEVEL", "WARNING")}},
}
if os.environ.get("DURABLE_TEST_LOG_TIMES"):  # a harness's workers' log: when, which process and thread
    LOGGING["formatters"] = {"timed": {"format": "%(asctime)s %(process)d %(threadName)s %(message)s"}}
    LOGGING["handlers"]["console"]["formatter"] = "timed"
if os.environ.get("DURABLE_TEST_OWN_LOGGING"):  # the worker's own handler and format (test_telemetry)
    LOGGING = {"version": 1, "disable_existing_loggers": False}
DURABLE_LOG_FORMAT = os.environ.get("DURABLE_LOG_FORMAT", "text")
DURABLE_LISTEN_NOTIFY = os.environ.get("DURABLE_LISTEN_NOTIFY", "1") == "1"
DURABLE_MAX_DELIVERIES = int(os.environ.get("DURABLE_MAX_DELIVERIES", 5))
DURABLE_STEP_KILL_GRACE_SECONDS = float(os.environ.get("DURABLE_STEP_KILL_GRACE_SECONDS", 5))
# Fast password hashing: the API tests authenticate every request with HTTP basic auth.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DURABLE_CANCEL_GRACE_SECONDS = float(os.environ.get("DURABLE_CANCEL_GRACE_SECONDS", 5))
DURABLE_MISSING_CODE_GRACE_SECONDS = float(os.environ.get("DURABLE_MISSING_CODE_GRACE_SECONDS", 600))
# Queue limits for the worker processes of tests/test_queues.py (the test itself overrides the setting).
DURABLE_QUEUES = json.loads(os.environ.get("DURABLE_TEST_QUEUES", "{}"))

if os.environ.get("DURABLE_TEST_CLOCK_SKEW"):
    # RELIABILITY T22: this process's wall clock is wrong (see tests/harness/skew.py).
    from tests.harness.skew import install as _skew

    _skew(os.environ["DURABLE_TEST_CLOCK_SKEW"])

if os.environ.get("DURABLE_TEST_OFFLOAD_DIR"):
    # Payloads over 4 KB stored apart, in worker processes too (tests/harness/partitioned_runs.py).
    from django.conf import global_settings as _defaults

    DURABLE_PAYLOAD_OFFLOAD_BYTES = 4096
    STORAGES = {**_defaults.STORAGES, "durable": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": os.environ["DURABLE_TEST_OFFLOAD_DIR"], "base_url": "/durable-payloads/"}}}

# The test app registers workflows that fail on purpose where durable.describe() runs them too (a
# RetryPolicy built from an input, a KeyError raised, an await the engine refuses): their shapes
# stop, which every worker process the tests start would print as a warning. The warning itself
# is tested by calling the check (tests/test_context_contract.py).
SILENCED_SYSTEM_CHECKS = ["django_durable.W005"]

# The collections a worker process makes from django-durable's import (once its startup module is
# loaded) to the freeze before its loop (tests/test_worker_processes.py: none, the collector is held
# off): counted by a gc callback.
start_collections: list[int] = []
if os.environ.get("DURABLE_TEST_COUNT_COLLECTIONS"):
    import gc
    import sys

    def _count_collection(phase, info):
        loaded = hasattr(sys.modules.get("django_durable.startup"), "release_collector")
        if phase == "start" and loaded and not gc.get_freeze_count():
            start_collections.append(info["generation"])

    gc.callbacks.append(_count_collection)
