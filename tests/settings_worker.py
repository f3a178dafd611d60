"""tests.settings for workers only, as docs/workers.md advises a project to start its own: the same
settings, less the apps that only serve requests."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS as PROJECT_APPS

SERVING_ONLY = {"django.contrib.admin", "django.contrib.sessions", "django.contrib.messages",
                "django.contrib.staticfiles", "rest_framework"}
INSTALLED_APPS = [app for app in PROJECT_APPS if app not in SERVING_ONLY]
