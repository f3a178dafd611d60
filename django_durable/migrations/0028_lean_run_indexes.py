"""A run's parent and subject type lose their full indexes: every run was in both, and each of its
status changes wrote both again. Its children keep an index of the runs that have a parent.

The new index is built before the full one goes, and on PostgreSQL CONCURRENTLY (as 0022 builds
its index): the runs table holds every run ever started, and a plain CREATE INDEX would hold off
the starts and the workers' writes while it read all of them. A partitioned runs table cannot build
one concurrently; its index is built on each partition in turn.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEX = models.Index(condition=models.Q(("parent__isnull", False)), fields=["parent"], name="durable_run_children")


def _partitioned(schema_editor) -> bool:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass('durable_workflow_run')")
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


def create(apps, schema_editor):
    model = apps.get_model("django_durable", "WorkflowRun")
    if schema_editor.connection.vendor == "postgresql" and not _partitioned(schema_editor):
        sql = str(INDEX.create_sql(model, schema_editor, concurrently=True))
        schema_editor.execute(sql.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1))
    else:
        schema_editor.add_index(model, INDEX)


def drop(apps, schema_editor):
    model = apps.get_model("django_durable", "WorkflowRun")
    if schema_editor.connection.vendor == "postgresql" and not _partitioned(schema_editor):
        schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{INDEX.name}"')
    else:
        schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('contenttypes', '0002_remove_content_type_name'),
        ('django_durable', '0027_fair_turns'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='workflowrun', index=INDEX)],
            database_operations=[migrations.RunPython(create, drop)],
        ),
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
