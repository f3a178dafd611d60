"""A django.tasks task, run by the durable workers (settings.TASKS: DurableBackend)."""

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task

from .models import SentEmail


@task(queue_name="default")
def send_email(order_id: int, to: str, subject: str, body: str) -> int:
    """Send an e-mail (here: keep it in the shop's outbox); the id of what was sent."""
    return SentEmail.objects.create(order_id=order_id, to=to, subject=subject, body=body).pk
