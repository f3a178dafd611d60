"""Settings of the benchmark harness: the durable app, the benchmark workflows, DATABASE_URL."""

import os

import environ

SECRET_KEY = "bench-only"
USE_TZ = True
TIME_ZONE = "UTC"
DEBUG = False
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_durable", "bench.benchapp"]
DATABASES = {"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}
DURABLE_PREPARED_STATEMENTS = os.environ.get("DURABLE_PREPARED_STATEMENTS", "1") == "1"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DURABLE_POLL_INTERVAL = float(os.environ.get("DURABLE_POLL_INTERVAL", 1.0))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_durable": {"handlers": ["console"], "level": "WARNING"}},
}
