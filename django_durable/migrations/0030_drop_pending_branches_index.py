"""The index of the branches not started yet goes: the reads that cancel a run's branches no longer
name their status in a way the planner can match to an index's predicate (models.pool.PENDING_UNSEEN
says why), so none used it, and every branch item paid for it. They read a run's items through the
index of its id.

On PostgreSQL it is dropped CONCURRENTLY, and rebuilt so if the migration is reversed.
"""

from django.db import migrations, models

from ._concurrently import remove_index

INDEX = models.Index(fields=["run", "group"], condition=models.Q(("kind", "step"), ("status", "pending")),
                     name="durable_work_item_branches")


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('django_durable', '0029_queue_table_storage'),
    ]

    operations = [remove_index("WorkItem", INDEX)]
