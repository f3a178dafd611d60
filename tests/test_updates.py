"""Updates: durable.update() asks a running workflow (ctx.wait_for_update()) and returns its answer."""

from __future__ import annotations

import io
import threading

import pytest
from django.core.management import call_command
from django.db import connections
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import SignalMessage, Step, WorkflowRun
from django_durable.services import updates
from django_durable.testing import drain
from tests.conftest import ledger_counts, wait_for

pytestmark = pytest.mark.django_db


def answered(run, name, payload):
    """Send an update and have it answered by draining in this thread (no worker process)."""
    update_id = updates.send(run.pk, name, payload)
    drain()
    return updates.answer_of(run.pk, update_id, timeout=5, name=name)


def test_an_update_is_answered_by_the_workflow_and_journaled():
    run = durable.start("tests.cart")
    drain()
    assert answered(run, "add", "apple") == {"count": 1}
    assert answered(run, "add", "pear") == {"count": 2}
    with pytest.raises(durable.UpdateRejected, match="apple is in the cart already") as refused:
        answered(run, "add", "apple")
    assert refused.value.reason == "apple is in the cart already"
    assert answered(run, "add", "checkout") == {"items": ["apple", "pear"]}
    run.refresh_from_db()
    assert run.status == "completed" and run.get_result() == ["apple", "pear"]
    answers = Step.objects.filter(run=run, key__startswith="update-answer:")
    assert answers.count() == 4 and {step.kind for step in answers} == {"note"}
    with pytest.raises(durable.RunFinished):
        durable.update(run.pk, "add", "plum", timeout=1)


def test_an_update_not_answered_in_time_stays_queued_and_its_answer_can_be_read_later():
    run = durable.start("tests.cart")
    with pytest.raises(durable.WaitTimeout) as late:
        durable.update(run.pk, "add", "fig", timeout=0.05)  # no worker: nobody takes it
    drain()
    assert updates.answer_of(run.pk, late.value.update_id, timeout=1) == {"count": 1}
    assert SignalMessage.objects.filter(run=run).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_caller_waits_while_a_worker_answers():
    run = durable.start("tests.cart")
    drain()
    answers = []

    def ask():
        try:
            answers.append(durable.update(run.pk, "add", "kiwi", timeout=30))
        finally:
            connections.close_all()

    asker = threading.Thread(target=ask)
    asker.start()
    wait_for(lambda: SignalMessage.objects.filter(run=run).exists(), timeout=10, message="the request")
    drain()
    asker.join(timeout=30)
    assert answers == [{"count": 1}]


@pytest.mark.django_db(transaction=True)
def test_the_api_and_the_command_send_updates(admin_user):
    run = durable.start("tests.cart")
    drain()
    client = APIClient()
    client.force_authenticate(admin_user)
    url = f"/api/durable/workflows/{run.pk}/updates/add/"
    waiting = client.post(url, {"payload": "plum", "wait": 0}, format="json")
    assert waiting.status_code == 202 and waiting.json()["status"] == "waiting"
    update_id = waiting.json()["id"]
    drain()
    again = client.get(f"{url}{update_id}/")
    assert again.status_code == 200 and again.json() == {"id": update_id, "status": "answered", "answer": {"count": 1}}
    second = client.post(url, {"payload": "plum", "wait": 0}, format="json").json()["id"]
    drain()
    refused = client.get(f"{url}{second}/")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "update_rejected", refused.json()
    assert client.post(url, {"pay": 1}, format="json").status_code == 400
    assert client.get(f"{url}00000000-0000-4000-8000-000000000000/?wait=0").json()["status"] == "waiting"

    out = io.StringIO()
    thread = threading.Thread(target=lambda: (call_command("durable", "update", str(run.pk), "add", "--payload",
                                                           '"checkout"', stdout=out), connections.close_all()))
    thread.start()
    wait_for(lambda: SignalMessage.objects.filter(run=run, payload__contains="checkout").exists(), timeout=10,
             message="the command's request")
    drain()
    thread.join(timeout=30)
    assert out.getvalue().strip().startswith('{"items":["plum"')


def test_describe_shows_the_update():
    assert durable.describe("tests.cart")["shape"][0] == {"type": "update", "name": "add"}


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_between_the_request_and_the_answer_neither_loses_it_nor_answers_twice(start_worker, tmp_path):
    reached, release = tmp_path / "reached", tmp_path / "release"
    run = durable.start("tests.cart", reached=str(reached), release=str(release))
    first = start_worker(burst=False)
    answers = []

    def ask():
        try:
            answers.append(durable.update(run.pk, "add", "apple", timeout=90))
        finally:
            connections.close_all()

    asker = threading.Thread(target=ask)
    asker.start()
    wait_for(reached.exists, timeout=60, message="the worker taking the update")
    # The run took the request (its wait is in the journal) and is pricing the item: no answer yet.
    assert Step.objects.filter(run=run, key="update:add:0").exists()
    first.kill()  # SIGKILL, between the request taken and the answer
    release.touch()
    second = start_worker(burst=False)
    asker.join(timeout=120)
    assert answers == [{"count": 1}]
    assert ledger_counts(run.pk) == {"price:0": 2}  # the step ran again (at least once) ...
    assert Step.objects.filter(run=run, key__startswith="update-answer:").count() == 1  # ... the answer once
    assert SignalMessage.objects.filter(run=run).count() == 1
    assert durable.update(run.pk, "add", "checkout", timeout=60) == {"items": ["apple"]}
    wait_for(lambda: WorkflowRun.objects.get(pk=run.pk).status == "completed", timeout=30, message="the end")
    assert second.running()
