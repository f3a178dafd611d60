"""Emitted events are kept (DURABLE_EVENT_RETENTION): a wait that begins a moment late still takes one."""

import datetime as dt

import pytest
from django.core.management import call_command

import django_durable as durable
from django_durable.engine import replay
from django_durable.models import SignalMessage, StoredEvent, WorkflowRun
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)


def ready():
    return "ready"


@durable.workflow("tests.kept.late_waiter")
def late_waiter(ctx, order_id, since=None):
    ctx.step("prepare", ready)
    return ctx.wait_for_event("payment.settled", match={"order": order_id}, timeout=3600, since=since)


@durable.workflow("tests.kept.two_waits")
def two_waits(ctx):
    first = ctx.wait_for_event("tick", timeout=3600)
    second = ctx.wait_for_event("tick", timeout=3600)
    return [first, second]


def status_and_result(run):
    run = WorkflowRun.objects.get(pk=run.pk)
    return run.status, run.get_result()


def test_an_event_emitted_before_the_wait_began_is_taken_by_it():
    run = durable.start(late_waiter, 42)
    assert durable.emit_event("payment.settled", {"order": 42, "amount": 30}) == 0  # nobody waits yet
    durable.emit_event("payment.settled", {"order": 41})  # another order's
    drain()
    assert status_and_result(run) == ("completed", {"order": 42, "amount": 30})
    message = SignalMessage.objects.get(run=run)
    assert message.event is not None and message.consumed_by == "event:payment.settled:0"


def test_an_event_from_before_the_run_was_created_counts_only_with_an_earlier_since():
    durable.emit_event("payment.settled", {"order": 7})
    event_at = StoredEvent.objects.get().created_at
    default = durable.start(late_waiter, 7)
    earlier = durable.start(late_waiter, 7, since=event_at - dt.timedelta(seconds=1))
    drain()
    assert WorkflowRun.objects.get(pk=default.pk).status == "waiting"
    assert status_and_result(earlier) == ("completed", {"order": 7})


def test_each_kept_event_is_taken_once_per_run():
    run = durable.start(two_waits)
    durable.emit_event("tick", 1)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"  # the first wait took it
    durable.emit_event("tick", 2)
    drain()
    assert status_and_result(run) == ("completed", [1, 2])


def test_with_no_retention_an_early_event_is_lost_as_before(settings):
    settings.DURABLE_EVENT_RETENTION = 0
    run = durable.start(late_waiter, 5)
    durable.emit_event("payment.settled", {"order": 5})
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    assert not StoredEvent.objects.exists()


def test_an_event_emitted_while_the_wait_is_being_recorded_is_not_lost(monkeypatch):
    """The wait looked for a kept event and found none; the event is emitted before the wait's
    entry commits, so emit_event sees no wait either. The look after the commit finds it."""
    looked = replay.Session.take_stored_event

    def look_then_emit(self, *args, **kwargs):
        found = looked(self, *args, **kwargs)
        durable.emit_event("payment.settled", {"order": 9})  # commits at once: the wait is not written yet
        return found

    monkeypatch.setattr(replay.Session, "take_stored_event", look_then_emit)
    run = durable.start(late_waiter, 9)
    drain()
    assert status_and_result(run) == ("completed", {"order": 9})
    assert SignalMessage.objects.filter(run=run).count() == 1


def test_prune_deletes_events_kept_longer_than_the_retention(settings):
    durable.emit_event("old", 1)
    StoredEvent.objects.update(created_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=8))
    durable.emit_event("new", 2)
    call_command("durable", "prune", stdout=open("/dev/null", "w"))
    assert list(StoredEvent.objects.values_list("name", flat=True)) == ["new"]


def test_the_admin_lists_kept_events_and_hides_payloads_without_the_permission(admin_client, django_user_model):
    from django.contrib.auth.models import Permission

    run = durable.start(late_waiter, 11)
    durable.emit_event("payment.settled", {"order": 11, "card": "4242"})
    drain()
    page = admin_client.get("/admin/django_durable/storedevent/").content.decode()
    assert "payment.settled" in page and "4242" in page
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    admin_client.force_login(viewer)
    page = admin_client.get("/admin/django_durable/storedevent/")
    assert page.status_code == 200
    assert "payment.settled" in page.content.decode() and "4242" not in page.content.decode()
    detail = admin_client.get(f"/admin/django_durable/storedevent/{StoredEvent.objects.get().pk}/change/")
    assert detail.status_code == 200 and "4242" not in detail.content.decode()
