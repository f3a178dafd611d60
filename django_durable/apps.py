"""The Django app: registers system checks and discovers each installed app's workflows.py."""

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DurableConfig(AppConfig):
    name = "django_durable"
    label = "django_durable"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from . import checks  # noqa: F401 - registers the system checks

        # Like admin.py: every installed app's workflows.py registers its workflows.
        autodiscover_modules("workflows")
