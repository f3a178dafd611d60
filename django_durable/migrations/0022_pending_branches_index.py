"""An index of the branches not started yet, by run and group (tests/test_plans.py says why).

On PostgreSQL it is built CONCURRENTLY: the work-item table holds an item for every run ever
started, and a plain CREATE INDEX would hold off the workers' writes while it read all of them.
"""

from django.db import migrations, models

INDEX = models.Index(fields=["run", "group"], condition=models.Q(("kind", "step"), ("status", "pending")),
                     name="durable_work_item_branches")


def create(apps, schema_editor):
    model = apps.get_model("django_durable", "WorkItem")
    if schema_editor.connection.vendor == "postgresql":
        sql = str(INDEX.create_sql(model, schema_editor, concurrently=True))
        schema_editor.execute(sql.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1))
    else:
        schema_editor.add_index(model, INDEX)


def drop(apps, schema_editor):
    model = apps.get_model("django_durable", "WorkItem")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{INDEX.name}"')
    else:
        schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('django_durable', '0021_audit_trail_and_worker_machine'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name='workitem', index=INDEX)],
            database_operations=[migrations.RunPython(create, drop)],
        ),
    ]
