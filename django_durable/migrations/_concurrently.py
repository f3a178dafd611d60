"""An index added to or removed from a big table without holding off its writers (migrations 0022,
0028 and 0030).

Django's migration loader passes over this module (its name starts with an underscore).
"""

from django.db import migrations


def add_index(model_name: str, index) -> migrations.SeparateDatabaseAndState:
    """AddIndex, built on PostgreSQL with CREATE INDEX CONCURRENTLY (IF NOT EXISTS: a migration
    stopped halfway runs again), which does not block the table's writes while it reads every row;
    a partitioned table cannot build one concurrently, so there, and on SQLite, a plain one. The
    migration that uses it must say ``atomic = False``."""

    def built_plainly(schema_editor, table: str) -> bool:
        if schema_editor.connection.vendor != "postgresql":
            return True
        with schema_editor.connection.cursor() as cursor:
            cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table])
            row = cursor.fetchone()
        return row is not None and row[0] == "p"

    def create(apps, schema_editor):
        model = apps.get_model("django_durable", model_name)
        if built_plainly(schema_editor, model._meta.db_table):
            schema_editor.add_index(model, index)
        else:
            sql = str(index.create_sql(model, schema_editor, concurrently=True))
            schema_editor.execute(sql.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1))

    def drop(apps, schema_editor):
        model = apps.get_model("django_durable", model_name)
        if built_plainly(schema_editor, model._meta.db_table):
            schema_editor.remove_index(model, index)
        else:
            schema_editor.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{index.name}"')

    return migrations.SeparateDatabaseAndState(
        state_operations=[migrations.AddIndex(model_name=model_name.lower(), index=index)],
        database_operations=[migrations.RunPython(create, drop)],
    )


def remove_index(model_name: str, index) -> migrations.SeparateDatabaseAndState:
    """RemoveIndex, as add_index() adds one: on PostgreSQL DROP INDEX CONCURRENTLY, which waits for
    the transactions using the index instead of blocking the table; rebuilt the same way backwards."""
    added = add_index(model_name, index)
    create, drop = added.database_operations[0].code, added.database_operations[0].reverse_code
    return migrations.SeparateDatabaseAndState(
        state_operations=[migrations.RemoveIndex(model_name=model_name.lower(), name=index.name)],
        database_operations=[migrations.RunPython(drop, create)],
    )
