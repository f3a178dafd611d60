"""Settings of the example project, read from the environment with django-environ.

DATABASE_URL defaults to a SQLite file beside this package; set it to a postgres:// URL to run
the example on PostgreSQL.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, True),
    SECRET_KEY=(str, "django-insecure-example-project-only"),
    DATABASE_URL=(str, f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
    ALLOWED_HOSTS=(list, ["127.0.0.1", "localhost"]),
)

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_durable",
    "example_project.orders",
    "example_project.examples",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "example_project.wsgi.application"

DATABASES = {"default": env.db("DATABASE_URL")}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    # Several worker processes write to one SQLite file: WAL lets readers and the writer work
    # side by side, IMMEDIATE transactions take the write lock up front instead of failing
    # with "database is locked" halfway through, and the timeout waits for that lock.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
else:
    # Workers keep their connections; web requests may reuse them for a minute.
    DATABASES["default"]["CONN_MAX_AGE"] = 60

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# django.tasks tasks (orders/tasks.py) on the durable workers. Django 6 ships django.tasks; on
# Django 5.2 it is the django-tasks backport, an app of its own.
try:
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")
TASKS = {"default": {"BACKEND": "django_durable.tasks.DurableBackend"}}
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Every line about a run names it (and its step): django_durable.telemetry.LogContextFilter.
    "filters": {"durable": {"()": "django_durable.telemetry.LogContextFilter"}},
    "formatters": {"plain": {"()": "django_durable.telemetry.WorkerFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["durable"]}},
    "loggers": {"django_durable": {"handlers": ["console"], "level": "INFO"}},
}
