"""Runs of a model instance: start(..., subject=obj), durable.runs_for(obj), one run at a time per
subject, the runs on the model's own admin page (test client and browser), and the subject deleted."""

import warnings

import pytest

import django_durable as durable
from django_durable.models import WorkflowRun
from django_durable.testing import drain
from tests.testapp.models import Ticket

pytestmark = pytest.mark.django_db(transaction=True)

TICKETS = "/admin/testapp/ticket/"


def test_runs_for_finds_the_runs_of_a_row_newest_first():
    first, second = Ticket.objects.create(title="printer"), Ticket.objects.create(title="vpn")
    a = durable.start("tests.three_steps", subject=first)
    b = durable.start("tests.echo", 1, subject=first)
    durable.start("tests.three_steps", subject=second)
    durable.start("tests.three_steps")
    assert [run.pk for run in durable.runs_for(first)] == [b.pk, a.pk]
    assert [run.pk for run in durable.runs_for(first, workflow="tests.echo")] == [b.pk]
    run = WorkflowRun.objects.get(pk=a.pk)
    assert (run.subject, run.subject_label) == (first, "Ticket 1: printer".replace("1", str(first.pk), 1))
    with pytest.raises(ValueError, match="saved model instance"):
        durable.start("tests.three_steps", subject=Ticket(title="unsaved"))
    with pytest.raises(ValueError):
        durable.runs_for("not a row")


def test_one_at_a_time_refuses_a_second_unfinished_run_for_the_same_subject():
    ticket, other = Ticket.objects.create(title="printer"), Ticket.objects.create(title="vpn")
    first = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
    with pytest.raises(durable.SubjectBusy) as busy:
        durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
    assert busy.value.run_id == first.pk and "printer" in str(busy.value)
    durable.start("tests.ticket_flow", other.pk, subject=other)  # another subject: fine
    durable.start("tests.three_steps", subject=ticket)  # another workflow: fine
    drain()
    with pytest.raises(durable.SubjectBusy):  # still unfinished: waiting for "resolved"
        durable.start("tests.ticket_flow", ticket.pk, subject=ticket, idempotency_key="again")
    durable.signal(first.pk, "resolved")
    drain()
    assert WorkflowRun.objects.get(pk=first.pk).status == "completed"
    second = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)  # the first one finished
    durable.cancel(second.pk)
    third = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
    with pytest.raises(durable.InvalidTransition, match="another run"):
        durable.retry_run(second.pk)  # would make two
    assert WorkflowRun.objects.get(pk=third.pk).status == "pending"


def test_deleting_the_subject_leaves_its_runs():
    ticket = Ticket.objects.create(title="printer")
    run = durable.start("tests.three_steps", subject=ticket)
    ticket.delete()
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert (run.status, run.subject, run.subject_label) == ("completed", None, "Ticket 1: printer".replace(
        "1", run.subject_id, 1))


def test_the_runs_show_on_the_rows_admin_page_and_start_from_its_list(admin_client):
    ticket = Ticket.objects.create(title="printer")
    run = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
    drain()
    page = admin_client.get(f"{TICKETS}{ticket.pk}/change/").content.decode()
    assert "Workflow runs" in page and f"/admin/django_durable/workflowrun/{run.pk}/change/" in page
    assert "signal &#x27;resolved&#x27;" in page and "1 of 2" in page  # what it waits for, its progress
    assert 'title="completed">triage<' in page  # its latest steps
    cancel = f"/admin/django_durable/workflowrun/{run.pk}/do/cancel/"
    assert cancel in page  # act from the row's page
    admin_client.post(cancel, {"reason": "duplicate ticket", "apply": "1"})
    assert WorkflowRun.objects.get(pk=run.pk).status == "cancelled"
    cancelled = admin_client.get(f"{TICKETS}{ticket.pk}/change/").content.decode()
    assert f"/admin/django_durable/workflowrun/{run.pk}/do/retry/" in cancelled
    assert 'title="stopped">signal:resolved:0<' in cancelled and 'title="waiting"' not in cancelled  # its wait ended with it
    other = Ticket.objects.create(title="vpn")
    durable.start("tests.ticket_flow", ticket.pk, subject=ticket)  # the ticket is busy again
    response = admin_client.post(TICKETS, {"action": "durable_start_tests.ticket_flow",
                                           "_selected_action": [ticket.pk, other.pk]}, follow=True)
    text = response.content.decode()
    assert "Started tests.ticket_flow for 1 row(s)." in text and "already has an unfinished run" in text
    assert [r.workflow for r in durable.runs_for(other)] == ["tests.ticket_flow"]


def test_the_rows_admin_pages_raise_no_deprecation_warning(admin_client):
    """Django 6.1 warns of a get_actions() without its `action_location` (and will stop calling it
    for the list in 2028): the list and the row's page are read without a warning."""
    ticket = Ticket.objects.create(title="printer")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        listed = admin_client.get(TICKETS).content.decode()
        page = admin_client.get(f"{TICKETS}{ticket.pk}/change/")
    assert page.status_code == 200 and "durable_start_tests.ticket_flow" in listed
    assert not [w for w in caught if issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))], [
        str(w.message) for w in caught]


def test_a_user_who_may_not_see_runs_does_not_see_them_on_the_page(client, django_user_model):
    from django.contrib.auth.models import Permission

    clerk = django_user_model.objects.create_user("clerk", password="a-long-password", is_staff=True)
    clerk.user_permissions.add(*Permission.objects.filter(codename__in=["view_ticket", "change_ticket"]))
    ticket = Ticket.objects.create(title="printer")
    durable.start("tests.three_steps", subject=ticket)
    client.force_login(clerk)
    page = client.get(f"{TICKETS}{ticket.pk}/change/")
    assert page.status_code == 200 and "Workflow runs" not in page.content.decode()


def test_a_model_can_have_its_rows_runs_cancelled_when_the_row_is_deleted():
    from django.db import transaction
    from django.db.models.signals import post_delete

    durable.cancel_runs_on_delete(Ticket, workflows=["tests.ticket_flow"])
    try:
        ticket = Ticket.objects.create(title="printer")
        flow = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
        other = durable.start("tests.approval", subject=ticket)  # another workflow: left alone
        with pytest.raises(RuntimeError), transaction.atomic():
            Ticket.objects.filter(pk=ticket.pk).delete()
            raise RuntimeError("rolled back")
        assert WorkflowRun.objects.get(pk=flow.pk).status == "pending"  # the deletion did not commit
        ticket.delete()
        assert WorkflowRun.objects.get(pk=flow.pk).status == "cancelled"
        assert WorkflowRun.objects.get(pk=other.pk).status == "pending"
    finally:
        post_delete.disconnect(sender=Ticket, dispatch_uid=f"durable-subject-{Ticket._meta.label}")
