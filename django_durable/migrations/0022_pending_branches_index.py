"""An index of the branches not started yet, by run and group (tests/test_plans.py says why).

On PostgreSQL it is built CONCURRENTLY: the work-item table holds an item for every run ever
started, and a plain CREATE INDEX would hold off the workers' writes while it read all of them.
"""

from django.db import migrations, models

from ._concurrently import add_index

INDEX = models.Index(fields=["run", "group"], condition=models.Q(("kind", "step"), ("status", "pending")),
                     name="durable_work_item_branches")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('django_durable', '0021_audit_trail_and_worker_machine'),
    ]

    operations = [add_index("WorkItem", INDEX)]
