"""The migrations make the tables the models describe, and what a job's rows are indexed by."""

import io

import pytest
from django.core.management import call_command
from django.db import connection, models

from django_durable.models import WorkflowRun

pytestmark = pytest.mark.timeout(120)


@pytest.mark.django_db
def test_the_migrations_match_the_models():
    """A change to a model ships with its migration: makemigrations finds nothing to write."""
    out = io.StringIO()
    try:
        call_command("makemigrations", "django_durable", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit:
        pytest.fail(f"The models and the migrations differ:\n{out.getvalue()}")


def _index_definitions(table: str) -> list[str]:
    """The CREATE INDEX statements of `table` as the database has them (the migrations' work)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [table])
        else:
            cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s AND sql IS NOT NULL",
                           [table])
        return [definition for (definition,) in cursor.fetchall()]


@pytest.mark.django_db
def test_a_run_is_indexed_by_its_parent_and_subject_only_when_it_has_them():
    """Every index a run is in costs each of its status changes an entry: a run with no parent or
    subject is in none of theirs (their foreign keys carry no index of their own)."""
    fields = {f.name: f for f in WorkflowRun._meta.get_fields() if hasattr(f, "db_index")}
    assert not fields["parent"].db_index and not fields["subject_type"].db_index
    partial = {index.name: index for index in WorkflowRun._meta.indexes}
    assert partial["durable_run_children"].fields == ["parent"]
    assert partial["durable_run_children"].condition is not None
    assert partial["durable_run_subject"].condition is not None
    # And in the database the migrations made: every index over the parent or the subject's type
    # leaves out the runs that have none.
    definitions = _index_definitions("durable_workflow_run")
    over = [d for d in definitions if "parent_id" in d or "subject_type_id" in d]
    assert any("durable_run_children" in d for d in over), definitions
    assert all(" WHERE " in d.upper() for d in over), over


@pytest.mark.django_db
def test_a_start_and_a_checkpoint_check_no_constraint_against_their_run():
    """The work items and the journal keep their run's id without a foreign key constraint in the
    database (migration 0036): its check would look the run up and lock its row at every start and
    every checkpoint. Django's own deletions still cascade to them."""
    with connection.cursor() as cursor:
        for table in ("durable_work_item", "durable_step"):
            constraints = connection.introspection.get_constraints(cursor, table)
            references = {name: c["foreign_key"] for name, c in constraints.items() if c["foreign_key"]}
            assert references == {}, (table, references)
    from django_durable.models import Step, WorkItem

    for model in (WorkItem, Step):
        field = model._meta.get_field("run")
        assert field.remote_field.on_delete is models.CASCADE and not field.db_constraint


@pytest.mark.django_db
def test_the_hot_tables_leave_room_on_their_pages():
    """PostgreSQL: the work items keep 30% of a page free and are vacuumed and analyzed early, the
    runs keep 15% (migration 0029), so a row's new version usually stays on its page."""
    if connection.vendor != "postgresql":
        pytest.skip("storage parameters are PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class "
                       "WHERE relname IN ('durable_work_item', 'durable_workflow_run')")
        options = {name: set(values or []) for name, values in cursor.fetchall()}
    assert {"fillfactor=70", "autovacuum_vacuum_scale_factor=0.01",
            "autovacuum_analyze_scale_factor=0.02"} <= options["durable_work_item"]
    assert "fillfactor=85" in options["durable_workflow_run"]
