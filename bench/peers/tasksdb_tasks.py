"""The task of tasksdb_driver.py, in a module of its own so that db_worker can import it by path."""

from django.tasks import task


@task()
def one_step(n):
    return n
