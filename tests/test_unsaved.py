"""models.base.unsaved(): the start path's instance without Model.__init__ is the same instance."""

import datetime as dt
import uuid

import pytest
from django.db.models.expressions import DatabaseDefault
from django.db.models.signals import post_init

from django_durable.models import Timer, WorkflowRun, WorkItem
from django_durable.models.base import unsaved


def _values(instance) -> dict:
    """An instance's field values, a database default by what it stands for."""
    values = {}
    for field in type(instance)._meta.concrete_fields:
        value = getattr(instance, field.attname)
        values[field.attname] = ("db default", field.name) if isinstance(value, DatabaseDefault) else value
    return values


@pytest.mark.parametrize("values", [
    {"id": uuid.uuid4(), "workflow": "w", "input": '{"args": []}', "queue": "q", "priority": 3},
    {"workflow": "w", "parent_id": uuid.uuid4(), "detached": True, "subject_lock": "9:1",
     "scheduled_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "waiting_on": "starts at"},
    {},
])
def test_an_unsaved_run_is_the_instance_its_model_makes(values):
    made, built = WorkflowRun(**values), unsaved(WorkflowRun, **values)
    expected, got = _values(made), _values(built)
    if "id" not in values:  # each has a fresh id of its own
        assert got.pop("id") != expected.pop("id")
    assert got == expected
    assert built._state.adding and built._state.db is None and built._state is not made._state


def test_every_default_it_shares_is_immutable():
    for model in (WorkflowRun, WorkItem, Timer):
        for name, value in unsaved(model).__dict__.items():
            assert value is None or isinstance(value, (str, int, float, bool, uuid.UUID, dt.datetime, tuple,
                                                       frozenset, DatabaseDefault, type(WorkflowRun()._state))), \
                f"{model.__name__}.{name} defaults to a {type(value).__name__}, shared by every unsaved()"
    # A database default is one object for every instance (as Django 6's fields keep it; Django
    # 5.2's constructor makes one each time), a callable default a new value at each call.
    first, second = unsaved(WorkflowRun), unsaved(WorkflowRun)
    assert isinstance(first.created_at, DatabaseDefault) and first.created_at is second.created_at
    assert first.id != second.id


@pytest.mark.django_db(transaction=True)
def test_runs_sharing_a_database_default_each_save_their_own_value():
    db = WorkflowRun.objects.db
    first, second = unsaved(WorkflowRun, workflow="w1"), unsaved(WorkflowRun, workflow="w2")
    first.save(using=db, force_insert=True)
    assert isinstance(first.created_at, dt.datetime)
    assert isinstance(second.created_at, DatabaseDefault)  # the shared default is left as it was
    second.save(using=db, force_insert=True)
    assert isinstance(second.created_at, dt.datetime) and second.created_at >= first.created_at
    stored = dict(WorkflowRun.objects.filter(pk__in=[first.pk, second.pk]).values_list("workflow", "created_at"))
    assert stored == {"w1": first.created_at, "w2": second.created_at}


def test_an_unknown_field_is_refused():
    with pytest.raises(TypeError, match="has no field parent"):
        unsaved(WorkflowRun, workflow="w", parent=None)


def test_a_receiver_of_post_init_is_still_called():
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    post_init.connect(receiver, sender=WorkflowRun)
    try:
        run = unsaved(WorkflowRun, workflow="w")
    finally:
        post_init.disconnect(receiver, sender=WorkflowRun)
    assert seen == [run]


@pytest.mark.django_db(transaction=True)
def test_a_started_run_saves_and_reads_back():
    import django_durable as durable
    from django_durable.testing import drain

    @durable.workflow("unsaved.echo")
    def echo(ctx, n):
        return n + 1

    run = durable.start("unsaved.echo", 41)
    # What a start returns is the row it wrote (on PostgreSQL one statement reads back created_at
    # alone and gives updated_at the same value; elsewhere the ORM's insert).
    stored = type(run).objects.get(pk=run.pk)
    for field in type(run)._meta.concrete_fields:
        assert getattr(run, field.attname) == getattr(stored, field.attname), field.attname
    drain()
    run.refresh_from_db()
    assert (run.status, run.get_result()) == ("completed", 42)
