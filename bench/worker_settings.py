"""The benchmark project's settings for its workers, as docs/workers.md advises a project to start
its own: the same settings, less the apps that only serve requests (the set docs/workers.md names), which a
worker would otherwise import and set up at every start."""

from bench.settings import *  # noqa: F401,F403
from bench.settings import INSTALLED_APPS as PROJECT_APPS

SERVING_ONLY = {"django.contrib.admin", "django.contrib.sessions", "django.contrib.messages",
                "django.contrib.staticfiles", "rest_framework"}
INSTALLED_APPS = [app for app in PROJECT_APPS if app not in SERVING_ONLY]
