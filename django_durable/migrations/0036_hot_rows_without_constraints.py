"""A work item and a journal entry keep their run's id without a foreign key constraint in the
database. The constraint's check ran at every start (the run's work item) and every checkpoint (a
journal entry): a lookup of the run and a lock on its row, a WAL record each, for a row the same
transaction had just written or a claim of the run held. Django's deletions still cascade.

On PostgreSQL each is one ALTER TABLE ... DROP CONSTRAINT (a moment's exclusive lock, no rewrite).
Where the runs are partitioned the constraints are gone already, and where the journal is, its
parent table has none (the partition of the entries from before keeps its own): nothing is done
there. SQLite copies the two tables, as it does for any change of a column.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_durable', '0035_run_list_indexes_ascending'),
    ]

    operations = [
        migrations.AlterField(
            model_name='step',
            name='run',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='steps', to='django_durable.workflowrun'),
        ),
        migrations.AlterField(
            model_name='workitem',
            name='run',
            field=models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='work_items', to='django_durable.workflowrun'),
        ),
    ]
