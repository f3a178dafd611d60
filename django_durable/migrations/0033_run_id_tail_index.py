"""An index of the runs' ids read backwards, on PostgreSQL: the admin's search by the end of a run's
id (the short id it shows, its last 8 to 12 hex digits) reads it instead of every run (4.6 s with
10 million). The ids are random at their end, so nothing else narrows that search.

Built CONCURRENTLY where the runs table is plain (a partitioned one cannot be), and not at all on
SQLite, whose development databases are small and whose REVERSE is Django's own function, which
another client writing to the table would not have. The model's state does not know of it: no
field or index of it changes.
"""

from django.db import migrations

INDEX = "durable_run_id_reversed"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass('durable_workflow_run')")
        partitioned = cursor.fetchone()[0] == "p"
        cursor.execute(f"CREATE INDEX {'' if partitioned else 'CONCURRENTLY '}IF NOT EXISTS {INDEX} "
                       f"ON durable_workflow_run (reverse(id::text) text_pattern_ops)")


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('django_durable', '0032_queue_controls'),
    ]

    operations = [migrations.RunPython(create, drop)]
