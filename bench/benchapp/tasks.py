"""The benchmark's django.tasks tasks (django_durable.tasks.DurableBackend)."""

import time

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task()
def one_step(n):
    """One call, no work."""
    return n


@task()
def sleep_for(seconds):
    """Sleep `seconds` (bench/start_budget.py: a task still running when the worker is stopped)."""
    time.sleep(seconds)
    return seconds
