from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    name = "example_project.examples"
    label = "examples"
    verbose_name = "durable-execution examples"
