"""A run's parent and subject type lose their full indexes: every run was in both, and each of its
status changes wrote both again. Its children keep an index of the runs that have a parent.

The new index is built before the full one goes, and on PostgreSQL CONCURRENTLY (as 0022 builds
its index): the runs table holds every run ever started, and a plain CREATE INDEX would hold off
the starts and the workers' writes while it read all of them. A partitioned runs table cannot build
one concurrently; its index is built on each partition in turn.
"""

import django.db.models.deletion
from django.db import migrations, models

from ._concurrently import add_index

INDEX = models.Index(condition=models.Q(("parent__isnull", False)), fields=["parent"], name="durable_run_children")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('django_durable', '0027_fair_turns'),
    ]

    operations = [
        add_index("WorkflowRun", INDEX),
        migrations.AlterField(
            model_name='workflowrun',
            name='parent',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='django_durable.workflowrun'),
        ),
        migrations.AlterField(
            model_name='workflowrun',
            name='subject_type',
            field=models.ForeignKey(blank=True, db_constraint=False, db_index=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='contenttypes.contenttype'),
        ),
    ]
