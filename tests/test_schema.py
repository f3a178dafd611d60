"""The migrations make the tables the models describe, and what a job's rows are indexed by."""

import io

import pytest
from django.core.management import call_command

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


def test_a_run_is_indexed_by_its_parent_and_subject_only_when_it_has_them():
    """Every index a run is in costs each of its status changes an entry: a run with no parent or
    subject is in none of theirs (their foreign keys carry no index of their own)."""
    fields = {f.name: f for f in WorkflowRun._meta.get_fields() if hasattr(f, "db_index")}
    assert not fields["parent"].db_index and not fields["subject_type"].db_index
    partial = {index.name: index for index in WorkflowRun._meta.indexes}
    assert partial["durable_run_children"].fields == ["parent"]
    assert partial["durable_run_children"].condition is not None
    assert partial["durable_run_subject"].condition is not None
