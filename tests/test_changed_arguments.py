"""A step replayed with other arguments than it was recorded with: a NonDeterminismError naming the
key and the difference, the run held ``blocked`` for an operator (admin, API, signal, audit trail),
resumed by a retry once the code is fixed; runs recorded before fingerprints existed keep working."""

import pytest
from rest_framework.test import APIClient

import django_durable as durable
from django_durable import signals
from django_durable.models import Step, WorkflowEvent, WorkflowRun
from django_durable.replaycheck import check_replay
from django_durable.testing import drain
from tests.conftest import assert_settled, ledger_counts, wait_for
from tests.testapp import ledger
from tests.testapp.workflows import mark

pytestmark = pytest.mark.django_db(transaction=True)

code = {"cents": 1000, "order": "ab", "catch": False}


def charge(run_id, order):
    ledger.record(run_id, "charge")
    return order


@durable.workflow("tests.changed.charge")
def charges(ctx):
    try:
        ctx.step("charge", charge, ctx.run_id, {"cents": code["cents"], "currency": "EUR"})
    except durable.NonDeterminismError:
        if not code["catch"]:
            raise
    ctx.wait_for_signal("shipped")
    ctx.step("receipt", mark, ctx.run_id, "receipt")
    return code["cents"]


def keyword(a=None, b=None, items=None):
    return [a, b]


@durable.workflow("tests.changed.same")
def same_call(ctx):
    """Equal arguments written another way: keywords and dict keys in another order, a tuple for a list."""
    if code["order"] == "ab":
        ctx.step("kw", keyword, a=1, b={"x": 1, "y": (1, 2)})
    else:
        ctx.step("kw", keyword, b={"y": [1, 2], "x": 1}, a=1)
    ctx.step("set", keyword, items={code["cents"]})  # a set: no fingerprint of its arguments, not checked
    ctx.wait_for_signal("go")
    return "done"


@durable.workflow("tests.changed.child")
def parent(ctx):
    result = ctx.child("kid", "tests.echo", code["cents"])
    ctx.wait_for_signal("go")
    return result


@durable.workflow("tests.changed.branches")
def fan_out(ctx):
    results = ctx.map("each", mark, [[ctx.run_id, f"item-{code['cents']}"]])
    ctx.wait_for_signal("go")
    return results


def hold(run):
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "blocked", (run.status, run.error)
    return run


@pytest.fixture(autouse=True)
def first_version():
    code.update(cents=1000, order="ab", catch=False)


def test_a_changed_argument_blocks_the_run_until_the_code_is_fixed():
    run = durable.start(charges)
    drain()  # charged 1000, waiting to ship
    told = []
    signals.run_blocked.connect(lambda sender, **kw: told.append(kw), weak=False, dispatch_uid="told")
    try:
        code["cents"] = 1200  # the deploy changes the amount
        durable.signal(run.pk, "shipped")
        drain()
    finally:
        signals.run_blocked.disconnect(dispatch_uid="told")
    run = hold(run)
    assert run.waiting_on.startswith(
        "a fix of the code: Step 'charge' was recorded with other arguments than the workflow code now "
        "passes to tests.test_changed_arguments.charge (now ("
    ), run.waiting_on
    assert "'cents': 1200" in run.waiting_on and run.waiting_for == "code"
    assert ledger_counts(run.pk) == {"charge": 1}  # not charged again, no receipt
    assert [kw["run_id"] for kw in told] == [run.pk] and "'charge'" in told[0]["reason"]
    trail = WorkflowEvent.objects.get(run=run, type="blocked")
    assert "other arguments" in trail.message and trail.actor == ""
    assert not Step.objects.filter(run=run, key="receipt").exists()
    assert WorkflowRun.objects.filter(status="blocked").stuck().count() == 0  # held on purpose, not stuck
    assert [v.run_id for v in check_replay() if not v.ok] == [str(run.pk)]

    durable.retry_run(run.pk, by="ops")  # not fixed yet: blocked again, nothing done twice
    drain()
    hold(run)
    code["cents"] = 1000  # the fix
    assert [v for v in check_replay() if not v.ok] == []
    durable.retry_run(run.pk, by="ops")
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert (run.status, run.get_result()) == ("completed", 1000)
    assert ledger_counts(run.pk) == {"charge": 1, "receipt": 1}
    assert list(WorkflowEvent.objects.filter(run=run, type="retried").values_list("data", flat=True)) == [
        {"from": "blocked"}, {"from": "blocked"}]
    assert_settled()


def test_the_run_is_blocked_even_when_the_workflow_code_catches_the_error():
    run = durable.start(charges)
    drain()
    code.update(cents=5, catch=True)
    durable.signal(run.pk, "shipped")
    drain()
    hold(run)
    assert ledger_counts(run.pk) == {"charge": 1}  # the code went on; nothing it did after counted


def test_the_same_arguments_written_another_way_replay():
    run = durable.start(same_call)
    drain()
    code.update(order="ba", cents=7)  # keywords and keys reordered, a tuple now a list; the set changed
    durable.signal(run.pk, "go")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    prints = dict(Step.objects.filter(run=run).values_list("key", "fingerprint"))
    assert len(prints["kw"]) == 16 and prints["set"] is None


def test_a_run_recorded_before_fingerprints_existed_keeps_working():
    run = durable.start(charges)
    drain()
    Step.objects.filter(run=run).update(fingerprint=None)  # as the schema before 0013 left it
    code["cents"] = 1200
    durable.signal(run.pk, "shipped")
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert (run.status, ledger_counts(run.pk)) == ("completed", {"charge": 1, "receipt": 1})


@pytest.mark.parametrize("workflow", [parent, fan_out], ids=["child", "branch"])
def test_a_child_or_a_branch_started_with_other_arguments_blocks(workflow):
    run = durable.start(workflow)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    code["cents"] = 1
    durable.signal(run.pk, "go")
    drain()
    run = hold(run)
    key = "kid" if workflow is parent else "each:0"
    assert run.waiting_on.startswith(f"a fix of the code: Step {key!r} was recorded with other arguments")


def test_an_operator_sees_and_resumes_a_blocked_run_in_the_admin_and_over_http(admin_client, admin_user):
    run = durable.start(charges)
    drain()
    code["cents"] = 1200
    durable.signal(run.pk, "shipped")
    drain()
    hold(run)
    page = admin_client.get(f"/admin/django_durable/workflowrun/{run.pk}/change/").content.decode()
    assert "Blocked: the code changed" in page and "was recorded with other arguments" in page
    retry = f"/admin/django_durable/workflowrun/{run.pk}/do/retry/"
    assert retry in page
    listing = admin_client.get("/admin/django_durable/workflowrun/?status=blocked").content.decode()
    assert str(run.pk) in listing
    api = APIClient()
    api.force_authenticate(admin_user)
    body = api.get(f"/api/durable/workflows/{run.pk}/").json()
    assert body["status"] == "blocked" and body["waiting_on"].startswith("a fix of the code: ")
    assert [r["id"] for r in api.get("/api/durable/workflows/?status=blocked").json()["results"]] == [str(run.pk)]
    assert api.post(f"/api/durable/workflows/{run.pk}/retry/").status_code == 202  # over HTTP: blocked again
    drain()
    hold(run)
    code["cents"] = 1000  # the fix
    assert admin_client.post(retry, {"apply": "1"}).status_code == 302  # from the admin
    drain()
    assert api.get(f"/api/durable/workflows/{run.pk}/").json()["status"] == "completed"


@pytest.mark.timeout(120)
def test_a_deploy_that_changes_an_argument_blocks_in_a_real_worker_and_a_fix_resumes_it(start_worker):
    run = durable.start("tests.charges_twice", "o-1")
    old = start_worker()
    assert old.wait() == 0, old.log()  # the old code: charged 1000 cents, waiting for "shipped"
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting", old.log()
    durable.signal(run.pk, "shipped")
    new = start_worker(env={"TESTAPP_CHARGE_CENTS": "1250"})  # the deploy
    assert new.wait() == 0
    wait_for(lambda: WorkflowRun.objects.get(pk=run.pk).status == "blocked", timeout=30,
             message="the run blocked by the new code")
    assert "now (" in WorkflowRun.objects.get(pk=run.pk).waiting_on and "1250" in new.log()
    assert ledger_counts(run.pk) == {"charge": 1}
    durable.retry_run(run.pk)
    assert start_worker(env={"TESTAPP_CHARGE_CENTS": "1000"}).wait() == 0  # the fix: the old amount again
    run = WorkflowRun.objects.get(pk=run.pk)
    assert (run.status, run.get_result()) == ("completed", 1000)
    assert ledger_counts(run.pk) == {"charge": 1, "receipt": 1}
    assert_settled()
