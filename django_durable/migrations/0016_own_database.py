"""The durable tables keep no foreign key constraint to tables of other apps (users, content
types): those may live on another database (DURABLE_DATABASE). 0014 and 0015 now create the two
columns without one; a database migrated before that still has them, and loses them here."""

from django.db import migrations

COLUMNS = [("durable_approval_decision", "user_id"), ("durable_workflow_run", "subject_type_id")]


def drop_constraints(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor != "postgresql":
        return  # SQLite's are part of the table; the tables they name are there (same database)
    quote = schema_editor.quote_name
    with connection.cursor() as cursor:
        for table, column in COLUMNS:
            for name, constraint in connection.introspection.get_constraints(cursor, table).items():
                if constraint["foreign_key"] and constraint["columns"] == [column]:
                    schema_editor.execute(f"ALTER TABLE {quote(table)} DROP CONSTRAINT {quote(name)}")


class Migration(migrations.Migration):
    dependencies = [("django_durable", "0015_run_subjects")]

    operations = [migrations.RunPython(drop_constraints, migrations.RunPython.noop, elidable=True)]
