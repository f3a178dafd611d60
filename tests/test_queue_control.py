"""Queues steered at runtime (services/queue_control.py): paused and resumed, their limits changed
and cleared, from Python, the admin's overview, the REST API and the command line; and a paused
queue on two worker processes."""

import io
import time

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.test import override_settings

import django_durable as durable
from django_durable import conf, queues, workpool
from django_durable.models import QueueChange, WorkflowRun, WorkItem
from django_durable.testing import drain
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

OVERVIEW = "/admin/django_durable/overview/"


def status(run):
    return WorkflowRun.objects.get(pk=run.pk).status


def test_a_paused_queue_is_left_out_of_every_claim_until_resumed():
    durable.pause_queue("emails", reason="the mail provider is down", by="ops")
    mail = durable.start_run("tests.three_steps", [], {"x": 1}, queue="emails")
    other = durable.start_run("tests.three_steps", [], {"x": 2})
    drain()
    assert (status(mail), status(other)) == ("pending", "completed")
    # Nothing of it is claimed: not by a worker of every queue, of that queue, or of several.
    for served in (None, ["emails"], ["emails", "default"]):
        assert workpool.claim(worker="w", queues=served, db="default") is None
    assert not workpool.pending_work(queues=None, db="default")  # a burst worker does not wait for it
    durable.resume_queue("emails", by="ops")
    drain()
    assert status(mail) == "completed"
    assert list(QueueChange.objects.order_by("id").values_list("queue", "actor", "change")) == [
        ("emails", "ops", {"paused": True, "reason": "the mail provider is down"}),
        ("emails", "ops", {"paused": False})]


def test_what_a_worker_holds_when_its_queue_is_paused_runs_on():
    run = durable.start_run("tests.three_steps", [], {"x": 1}, queue="emails")
    claim = workpool.claim(worker="w", queues=None, db="default")
    assert claim is not None and claim.run_id == run.pk
    durable.pause_queue("emails")
    workpool.release(claim, run_status=WorkflowRun.Status.PENDING)  # its holder hands it back, fenced
    assert status(run) == "pending"
    assert WorkItem.objects.get(run=run).status == "pending" and workpool.claim(worker="w", queues=None, db="default") is None


@override_settings(DURABLE_QUEUES={"emails": {"concurrency": 5, "rate_limit": "100/s"}})
def test_limits_set_at_runtime_override_the_setting_until_cleared():
    durable.set_queue_limits("emails", concurrency=1, by="ops")
    durable.set_queue_limits("reports", rate_limit="2/min", key_concurrency=3)
    limits = queues.configured()
    assert (limits["emails"].concurrency, limits["emails"].rate) == (1, (100, 1.0))  # the setting's rate kept
    assert (limits["reports"].rate, limits["reports"].key_concurrency) == ((2, 60.0), 3)
    assert not workpool.batches("default", None)  # a limited queue is claimed one at a time
    durable.set_queue_limits("emails", concurrency=None)  # drops that override only
    assert queues.configured()["emails"].concurrency == 5
    assert durable.clear_queue("reports") and not durable.clear_queue("reports")
    assert "reports" not in queues.configured()
    for bad in ({"concurrency": 0}, {"concurrency": "2"}, {"concurrency": 10**12}, {"rate_limit": "fast"}, {}):
        with pytest.raises(ValueError):
            durable.set_queue_limits("emails", **bad)
    with pytest.raises(ValueError, match="1 to 100"):
        durable.pause_queue("x" * 101)


def test_a_limit_set_at_runtime_holds_back_a_claim():
    runs = [durable.start_run("tests.three_steps", [], {"x": n}, queue="emails") for n in range(2)]
    first = workpool.claim(worker="w1", queues=None, db="default")
    assert first is not None
    durable.set_queue_limits("emails", concurrency=1)
    assert workpool.claim(worker="w2", queues=None, db="default") is None  # the one slot is taken
    durable.clear_queue("emails")
    assert workpool.claim(worker="w2", queues=None, db="default").run_id in {run.pk for run in runs}


def test_the_overview_steers_a_queue_with_the_permission(admin_client, client, django_user_model):
    durable.start_run("tests.three_steps", [], {"x": 1}, queue="emails")
    page = admin_client.get(OVERVIEW).content.decode()
    assert 'value="pause"' in page and 'id="durable-pause-queue"' in page
    response = admin_client.post(f"{OVERVIEW}queues/emails/", {"action": "pause", "reason": "provider down"})
    assert response.status_code == 302
    page = admin_client.get(OVERVIEW).content.decode()
    assert 'title="provider down">paused</span>' in page and 'value="resume"' in page
    admin_client.post(f"{OVERVIEW}queues/emails/", {"action": "limits", "concurrency": "2", "rate_limit": "5/s"})
    assert "2 at once, 5 per 1 s" in admin_client.get(OVERVIEW).content.decode()
    bad = admin_client.post(f"{OVERVIEW}queues/emails/", {"action": "limits", "concurrency": "-1"}, follow=True)
    assert "positive whole number" in bad.content.decode()
    admin_client.post(f"{OVERVIEW}queues/emails/", {"action": "clear"})
    assert not durable.clear_queue("emails")
    assert set(QueueChange.objects.values_list("actor", flat=True)) == {"admin"}

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_overview"))
    client.force_login(viewer)
    assert 'value="pause"' not in client.get(OVERVIEW).content.decode()
    assert client.post(f"{OVERVIEW}queues/emails/", {"action": "pause"}).status_code == 403


def test_the_api_steers_a_queue(admin_client, client, django_user_model):
    api = "/api/durable/queues/"
    paused = admin_client.post(f"{api}emails/pause/", {"reason": "down"}, content_type="application/json")
    assert paused.status_code == 200 and paused.json()["paused"] and paused.json()["reason"] == "down"
    limited = admin_client.put(f"{api}emails/limits/", {"concurrency": 3}, content_type="application/json")
    assert limited.json()["overrides"] == {"concurrency": 3} and limited.json()["in_force"] == "3 at once"
    assert admin_client.put(f"{api}emails/limits/", {"rate_limit": "fast"},
                            content_type="application/json").status_code == 400
    assert [state["name"] for state in admin_client.get(api).json()] == ["emails"]
    assert admin_client.post(f"{api}emails/resume/").json()["paused"] is False
    assert admin_client.delete(f"{api}emails/").status_code == 204
    assert admin_client.delete(f"{api}emails/").status_code == 404
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    client.force_login(viewer)
    assert client.get(api).status_code == 200
    refused = client.post(f"{api}emails/pause/", {}, content_type="application/json")
    assert refused.status_code == 403 and "change_queuecontrol" in refused.json()["error"]["message"]


def test_the_command_line_steers_a_queue():
    def durable_queues(*args):
        out = io.StringIO()
        call_command("durable", "queues", *args, stdout=out)
        return out.getvalue()

    assert "paused (provider down)" in durable_queues("pause", "emails", "--reason", "provider down")
    assert "limits: 2 at once, 10 per 1 s (set at runtime: concurrency 2, rate_limit 10/s)" in durable_queues(
        "limits", "emails", "--concurrency", "2", "--rate-limit", "10/s")
    assert "claimed from" in durable_queues("resume", "emails")
    assert durable_queues("list").startswith("emails")
    durable_queues("clear", "emails")
    assert "no change made at runtime" in durable_queues("clear", "emails")
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="positive whole number"):
        durable_queues("limits", "emails", "--concurrency", "2.5")
    actors = set(QueueChange.objects.values_list("actor", flat=True))
    assert len(actors) == 1 and actors.pop().startswith("cli:")


@pytest.mark.slow
def test_a_queue_paused_on_two_worker_processes(start_worker, tmp_path):
    """Both workers stop claiming from the paused queue at their next claim and finish what they
    hold; the pause outlives a worker's restart; resumed, its runs go."""
    def blocking(name, queue="default"):
        return durable.start_run("tests.block_in_b", [str(tmp_path / f"{name}.reached"), str(tmp_path / f"{name}.go")],
                                 {}, queue=queue)

    def reached(name):
        return (tmp_path / f"{name}.reached").exists()

    workers = [start_worker(burst=False), start_worker(burst=False)]
    held = blocking("held", queue="emails")
    wait_for(lambda: reached("held"), timeout=120, message="a worker holding a step of the queue")
    durable.pause_queue("emails", by="ops")
    waiting = [durable.start_run("tests.three_steps", [], {"x": n}, queue="emails") for n in range(4)]
    # The other worker's next claim: the paused queue's items are older (first in the claim order)
    # and yet it takes the run started after them on another queue.
    blocking("first")
    wait_for(lambda: reached("first"), timeout=120, message="the free worker's claim after the pause")
    assert {status(run) for run in waiting} == {"pending"}
    (tmp_path / "held.go").touch()  # what a worker holds runs on
    wait_for(lambda: status(held) == "completed", timeout=120, message="the held run")
    blocking("second")  # and the worker that held it, now free, also passes the paused queue over
    wait_for(lambda: reached("second"), timeout=120, message="the other worker's claim after the pause")
    assert {status(run) for run in waiting} == {"pending"}
    assert len(set(WorkflowRun.objects.filter(workflow="tests.block_in_b").values_list("last_worker", flat=True))) == 2
    (tmp_path / "first.go").touch()  # its worker goes on, and takes the next run on another queue
    blocking("third")
    wait_for(lambda: reached("third"), timeout=120, message="a worker held again")
    third_worker = WorkflowRun.objects.get(pk=WorkflowRun.objects.filter(workflow="tests.block_in_b").order_by(
        "-created_at").values_list("pk", flat=True)[0]).last_worker
    # The other worker, restarted: a new process, which has only the database to know of the pause.
    restarted = next(index for index, worker in enumerate(workers) if not third_worker.endswith(f":{worker.pid}"))
    (tmp_path / "second.go").touch()
    workers[restarted].signal(15)
    assert workers[restarted].wait() == 0
    workers[restarted] = start_worker(burst=False)
    more = [durable.start_run("tests.three_steps", [], {"x": n}) for n in range(10)]
    wait_for(lambda: all(status(run) == "completed" for run in more), timeout=120, message="runs after the restart")
    ran_more = set(WorkflowRun.objects.filter(pk__in=[run.pk for run in more]).values_list("last_worker", flat=True))
    assert ran_more == {WorkflowRun.objects.get(pk=more[0].pk).last_worker} and third_worker not in ran_more
    assert ran_more.pop().endswith(f":{workers[restarted].pid}")  # the new process took them
    assert {status(run) for run in waiting} == {"pending"}
    (tmp_path / "third.go").touch()
    durable.resume_queue("emails", by="ops")
    wait_for(lambda: all(status(run) == "completed" for run in waiting), timeout=120, message="the resumed queue's runs")
    for worker in workers:
        worker.signal(15)
        assert worker.wait() == 0


@pytest.mark.slow
def test_a_concurrency_set_at_runtime_holds_on_two_worker_processes(start_worker, tmp_path):
    """Concurrency 1 set while two workers of 2 slots each run: from a second later, at most one
    item of the queue runs at a time, on either worker."""
    workers = [start_worker("-c", "2", burst=False), start_worker("-c", "2", burst=False)]
    durable.set_queue_limits("emails", concurrency=1, by="ops")
    time.sleep(queues.REFRESH_SECONDS + 0.1)  # every worker's next claim reads it again
    hold = tmp_path / "hold"
    hold.mkdir()
    runs = [durable.start_run("tests.block_in_b", [str(hold / f"reached-{n}"), str(hold / f"go-{n}")], {}, queue="emails")
            for n in range(4)]
    released = set()
    for _ in range(4):
        def blocked():
            return [m for m in range(4) if (hold / f"reached-{m}").exists() and m not in released]

        wait_for(blocked, timeout=120, message="a step of the limited queue running")
        time.sleep(0.5)  # room for a second claim, were the limit not held (a correct one never makes one)
        assert len(blocked()) == 1, blocked()
        assert WorkItem.objects.filter(queue="emails", status="processing").count() == 1
        (hold / f"go-{blocked()[0]}").touch()
        released.add(blocked()[0])
    wait_for(lambda: all(status(run) == "completed" for run in runs), timeout=120, message="every limited run")
    for worker in workers:
        worker.signal(15)
        assert worker.wait() == 0
