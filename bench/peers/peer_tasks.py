"""The task of the django.tasks peers (django_peer.py), in a module of its own so that their
workers can import it by path."""

from django.tasks import task


@task()
def one_step(n):
    return n
