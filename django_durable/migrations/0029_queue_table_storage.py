"""Room on each page for the new versions of its rows, and an earlier autovacuum, on PostgreSQL.

A work item is written twice a turn (its claim, its end) and a run two or three times in its
life. With every page full (PostgreSQL's default), each new version goes to another page: the
update writes a lock record first, and a read then visits two pages. The work items' pages keep
30% free, the runs' 15% (their finished rows are the history the admin reads, packed closer);
the work items are vacuumed and analyzed after 1% and 2% of their rows changed, not 20% and 10%.
The settings take effect for the pages written from now on. A partitioned runs table keeps its
partitions' own settings.
"""

from django.db import migrations

SETTINGS = {
    "durable_work_item": "fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, "
                         "autovacuum_analyze_scale_factor = 0.02",
    "durable_workflow_run": "fillfactor = 85",
}
RESET = {
    "durable_work_item": "fillfactor, autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor",
    "durable_workflow_run": "fillfactor",
}


def _plain_tables(schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND oid = ANY(ARRAY[%s, %s]::regclass[])",
                       list(SETTINGS))
        return [name for (name,) in cursor.fetchall()]


def store(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in _plain_tables(schema_editor):
            schema_editor.execute(f"ALTER TABLE {table} SET ({SETTINGS[table]})")


def reset(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for table in _plain_tables(schema_editor):
            schema_editor.execute(f"ALTER TABLE {table} RESET ({RESET[table]})")


class Migration(migrations.Migration):

    dependencies = [
        ('django_durable', '0028_lean_run_indexes'),
    ]

    operations = [migrations.RunPython(store, reset)]
