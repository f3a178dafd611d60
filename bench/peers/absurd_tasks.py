"""django-absurd's W1 task (absurd_driver.py): ten steps, each checkpointed by Absurd, in a module
of its own so that its workers import it by path."""

from django.tasks import task
from django_absurd import get_absurd_context


@task()
def ten_steps(n):
    context = get_absurd_context()
    total = 0
    for i in range(10):
        total += context.step(f"step-{i}", lambda i=i: i)
    return total
