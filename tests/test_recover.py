"""durable.recover(), `durable recover` and the admin's Recover: a run nothing will advance gets its advance back."""

import io

import pytest
from django.core.management import call_command

import django_durable as durable
from django_durable.models import WorkflowEvent, WorkflowRun, WorkItem
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/django_durable/workflowrun/"


def lost_its_advance(run):
    """As after a restore from a backup taken between two writes: the run has no work item."""
    WorkItem.objects.filter(run=run).delete()


def test_recover_gives_a_stuck_run_its_advance_back_and_leaves_the_others():
    stuck = durable.start("tests.three_steps", x=1)
    lost_its_advance(stuck)
    waiting = durable.start("tests.awaits_shipping", 1)
    drain()  # waits for its event: something from outside will advance it
    assert [r.pk for r in WorkflowRun.objects.stuck(lease_expired=False)] == [stuck.pk]
    assert durable.recover() == [stuck.pk]
    assert WorkflowEvent.objects.filter(run=stuck, type="recovered").count() == 1
    drain()
    assert WorkflowRun.objects.get(pk=stuck.pk).get_result() == [1, 2, 3]
    assert WorkflowRun.objects.get(pk=waiting.pk).status == "waiting"
    assert durable.recover() == []  # nothing stuck any more


def test_a_completed_advance_item_is_made_ready_again():
    run = durable.start("tests.three_steps", x=2)
    WorkItem.objects.filter(run=run).update(status="completed")
    assert durable.recover([run.pk]) == [run.pk]
    assert WorkItem.objects.get(run=run).status == "pending"
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"


def test_the_command_lists_then_recovers():
    run = durable.start("tests.three_steps", x=3)
    lost_its_advance(run)
    out = io.StringIO()
    call_command("durable", "recover", "--dry-run", stdout=out)
    assert str(run.pk) in out.getvalue() and "1 run(s) that nothing will advance would get" in out.getvalue()
    assert not WorkItem.objects.filter(run=run).exists()
    out = io.StringIO()
    call_command("durable", "recover", stdout=out)
    assert "gave 1 run(s) their advance back" in out.getvalue()
    assert WorkItem.objects.filter(run=run, status="pending").exists()


def test_the_admin_action_recovers_and_reports_what_was_not_stuck(admin_client):
    stuck = durable.start("tests.three_steps", x=4)
    lost_its_advance(stuck)
    fine = durable.start("tests.three_steps", x=5)
    response = admin_client.post(RUNS, {"action": "recover_runs", "_selected_action": [stuck.pk, fine.pk],
                                        "apply": "1"}, follow=True)
    text = response.content.decode()
    assert "Recovered 1 run" in text and "not stuck" in text, text[-3000:]
    assert WorkItem.objects.filter(run=stuck, status="pending").exists()
