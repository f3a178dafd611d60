"""Settings of the benchmark harness: the durable app, the benchmark workflows, DATABASE_URL."""

import json
import os

import environ

SECRET_KEY = "bench-only"
USE_TZ = True
TIME_ZONE = "UTC"
DEBUG = False
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "rest_framework",
    "django_durable",
    "bench.benchapp",
]
# django.tasks on Django 6; the django-tasks backport (an app) on Django 5.2.
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
TASKS = {"default": {"BACKEND": "django_durable.tasks.DurableBackend"}}
# The admin and api sections render the operator dashboard and the API through the whole request stack.
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "bench.urls"
ALLOWED_HOSTS = ["testserver"]
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
DATABASES = {"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # bench/headline.py: as getting started sets it up
    DATABASES["default"]["OPTIONS"] = {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
DURABLE_PREPARED_STATEMENTS = os.environ.get("DURABLE_PREPARED_STATEMENTS", "1") == "1"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DURABLE_POLL_INTERVAL = float(os.environ.get("DURABLE_POLL_INTERVAL", 1.0))
DURABLE_LISTEN_NOTIFY = os.environ.get("DURABLE_LISTEN_NOTIFY", "1") == "1"  # bench/producers.py
DURABLE_CLAIM_BATCH = int(os.environ.get("DURABLE_CLAIM_BATCH", 64))
if os.environ.get("DURABLE_BENCH_DIRECT_URL"):  # DATABASE_URL is a transaction pooler: listen around it
    DATABASES["direct"] = {**environ.Env.db_url_config(os.environ["DURABLE_BENCH_DIRECT_URL"]),
                           "TEST": {"MIRROR": "default"}}
    DURABLE_LISTEN_DATABASE = "direct"
# No nightly durable.prune: a benchmark measures its own prune, and the built-in one firing at
# 03:17 UTC in the middle of a measurement deletes the history it measures (seen on 2026-11-25).
DURABLE_PRUNE_SCHEDULE = None
# Queue limits, for the limited rounds of bench/limits.py (JSON).
DURABLE_QUEUES = json.loads(os.environ.get("DURABLE_BENCH_QUEUES", "{}"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_durable": {"handlers": ["console"], "level": "WARNING"}},
}
# bench/payloads.py: large results stored apart, or allowed inline.
if os.environ.get("DURABLE_BENCH_OFFLOAD_BYTES"):
    DURABLE_PAYLOAD_OFFLOAD_BYTES = int(os.environ["DURABLE_BENCH_OFFLOAD_BYTES"])
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
        "durable": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                    "OPTIONS": {"location": os.environ["DURABLE_BENCH_STORAGE"]}},
    }
if os.environ.get("DURABLE_BENCH_MAX_PAYLOAD_BYTES"):
    DURABLE_MAX_PAYLOAD_BYTES = int(os.environ["DURABLE_BENCH_MAX_PAYLOAD_BYTES"])
