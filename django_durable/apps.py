"""The Django app: registers system checks and discovers each installed app's workflows.py (and
tasks.py, when TASKS uses django_durable.tasks.DurableBackend)."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DurableConfig(AppConfig):
    name = "django_durable"
    label = "django_durable"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        import logging

        from . import checks  # noqa: F401 - registers the system checks
        from .subjects import connect_deletions
        from .telemetry import LogContextFilter

        # Every line of ours carries the run and step it is about (record.run_id, record.step_key),
        # whatever handlers and formats the project configured.
        for name in ("django_durable", "django_durable.worker", "django_durable.api"):
            logger = logging.getLogger(name)
            if not any(isinstance(f, LogContextFilter) for f in logger.filters):
                logger.addFilter(LogContextFilter())

        connect_deletions()
        from .retention import register_prune

        register_prune()  # the built-in durable.prune and its schedule
        from .services.repairs import register_repair

        register_repair()  # the built-in durable.repair (repairs by filter)

        # Like admin.py: every installed app's workflows.py registers its workflows, and, when
        # TASKS runs tasks here, its tasks.py its django.tasks tasks (tasks.discover).
        autodiscover_modules("workflows")
        from django.conf import settings

        backends = getattr(settings, "TASKS", None) or {}
        if any(str(options.get("BACKEND", "")).endswith(".DurableBackend") for options in backends.values()):
            autodiscover_modules("tasks")
