import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Worker subprocesses of the telemetry tests write their spans to this file.
        if os.environ.get("DURABLE_TEST_SPANS"):
            from .spans import export_to_file

            export_to_file(os.environ["DURABLE_TEST_SPANS"])
