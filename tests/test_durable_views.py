"""Durable views: a view starts a workflow, answers 200 with its result within its budget, or 202
with a status URL that polling follows to the result; ATOMIC_REQUESTS; a worker killed in between."""

import os
import time

import pytest
from django.db import connection

from django_durable.models import WorkflowRun
from tests.conftest import ledger_counts, wait_for

# Async views over a real worker: their subject (Django's async support) differs between versions.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.urls"), pytest.mark.every_django]


def poll(client, url, *, until_finished=True, timeout=60.0):
    """GET the status URL until the run has finished (bounded); return the last answer's JSON."""
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(url).json()
        if body["finished"] or not until_finished:
            return body
        assert time.monotonic() < deadline, f"the run did not finish within {timeout} s: {body}"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_the_fast_path_answers_200_with_the_result(client, start_worker, monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "ATOMIC_REQUESTS", True)  # the view still commits its start
    start_worker(burst=False)
    response = client.get("/test/quick/?x=5")
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["result"]) == ("completed", [5, 6, 7])
    assert WorkflowRun.objects.get(pk=body["id"]).status == "completed"
    assert client.get("/test/quick/").status_code == 400  # the view answered itself: nothing started
    assert WorkflowRun.objects.count() == 1


@pytest.mark.timeout(180)
def test_the_slow_path_answers_202_and_polling_reaches_the_result_across_a_worker_crash(
        client, start_worker, tmp_path):
    reached, release = tmp_path / "reached", tmp_path / "release"
    worker = start_worker(burst=False)
    response = client.get(f"/test/slow/?reached={reached}&release={release}")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["status_url"] == response["Location"] and body["status_url"].startswith("/durable/runs/")
    wait_for(reached.exists, timeout=60, message="step b to start")
    running = poll(client, body["status_url"], until_finished=False)
    assert (running["id"], running["finished"]) == (body["id"], False)
    worker.kill()  # SIGKILL in the middle of step b
    release.touch()
    start_worker(burst=False)  # the next worker takes the run back when its lease expires
    done = poll(client, body["status_url"])
    assert (done["status"], done["result"]) == ("completed", "done")
    assert ledger_counts(body["id"])["a"] == 1  # recorded before the crash: not done again
    page = client.get(body["status_url"].replace("/status/", "/"))
    assert page.status_code == 200 and "Status: <strong>completed</strong>" in page.content.decode()


def test_the_status_url_is_only_for_its_holder(client, django_user_model):
    from django_durable.views import status_url
    import django_durable as durable

    run = durable.start("tests.three_steps")
    url = status_url(run.pk)
    assert client.get(url).json()["status"] == "pending"
    assert client.get(url[:-8] + "tampered/").status_code == 404
    ann = django_user_model.objects.create_user("ann", password="a-long-password")
    bob = django_user_model.objects.create_user("bob", password="a-long-password")
    client.force_login(ann)

    class Request:
        user = ann

    owned = status_url(run.pk, Request())
    assert client.get(owned).status_code == 200
    client.force_login(bob)
    assert client.get(owned).status_code == 404  # made for ann


@pytest.mark.timeout(120)
def test_an_html_view_redirects_to_a_page_that_refreshes_itself(client, start_worker, tmp_path):
    reached, release = tmp_path / "reached", tmp_path / "release"
    start_worker(burst=False)
    response = client.get(f"/test/slow-page/?reached={reached}&release={release}")
    assert response.status_code == 303 and response["Location"].startswith("/durable/runs/")
    page = client.get(response["Location"]).content.decode()
    assert '<meta http-equiv="refresh" content="1">' in page
    release.touch()
    wait_for(lambda: "Status: <strong>completed</strong>" in client.get(response["Location"]).content.decode(),
             timeout=60, message="the page to show the run completed")
    assert '<meta http-equiv="refresh"' not in client.get(response["Location"]).content.decode()
    assert os.path.exists(reached)
