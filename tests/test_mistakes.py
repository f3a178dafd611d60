"""Issue 30: mistakes caught when they are made, not after a person acted: key clashes and unknown
approvers found before a run starts (durable.describe(), a system check, `durable workflows`), a
signal no code waits for and a queue no worker serves said so where they are sent."""

import base64
import io

import pytest
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

import django_durable as durable
from django_durable import checks, registry
from django_durable.models import Worker, WorkflowRun
from django_durable.testing import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.urls")]


def notify(who):
    return f"told {who}"


@pytest.fixture
def registered():
    """Register workflows for one test only (their problems would fail every other test's checks)."""
    names = []

    def register(name, **options):
        def decorator(fn):
            names.append(name)
            return durable.workflow(name, **options)(fn)
        return decorator

    yield register
    for name in names:
        registry._registry.pop(name, None)


def test_a_key_a_wait_and_a_step_share_is_found_before_any_run(registered):
    @registered("tests.mistakes.clash")
    def clash(ctx, order_id):
        ctx.wait_for_approval("manager", approvers="testapp.approve_refund")
        ctx.step("manager", notify, order_id)

    problems = durable.describe(clash)["problems"]
    assert len(problems) == 1
    assert "'manager'" in problems[0] and "ctx.wait_for_approval()" in problems[0] and "ctx.step()" in problems[0]

    found = [error for error in checks.check_workflow_shapes() if "tests.mistakes.clash" in error.msg]
    assert [error.id for error in found] == ["django_durable.E011"]
    out = io.StringIO()
    call_command("durable", "workflows", stdout=out)
    assert "problem: The key 'manager'" in out.getvalue()


def test_a_key_reached_only_past_a_condition_on_data_is_a_warning(registered):
    @registered("tests.mistakes.maybe")
    def maybe(ctx, urgent):
        ctx.sleep("pause", 1)
        if urgent:
            ctx.step("pause", notify, "boss")

    found = [error for error in checks.check_workflow_shapes() if "tests.mistakes.maybe" in error.msg]
    assert [error.id for error in found] == ["django_durable.W004"]

    @registered("tests.mistakes.fine")
    def fine(ctx, kind):
        for item in kind:
            ctx.step(f"charge:{item}", notify, item)  # a key built from data: one per item
        ctx.wait_for_signal("approved")
        ctx.wait_for_signal("approved")  # its own key by call order
        ctx.set_progress(1, 2)
        ctx.set_progress(2, 2)

    assert durable.describe(fine)["problems"] == []


def test_a_clash_at_run_time_names_both_uses(registered):
    @registered("tests.mistakes.runtime")
    def runtime(ctx):
        ctx.sleep("cool-off", 0)
        return ctx.step("cool-off", notify, "customer")

    run = durable.start(runtime)
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    message = run.get_error()["message"]
    assert run.status == "failed"
    assert "'cool-off'" in message and "ctx.sleep()" in message and "ctx.step() of" in message


def test_approvers_naming_no_permission_or_group_are_refused(registered):
    @registered("tests.mistakes.typo_permission")
    def typo_permission(ctx):
        return ctx.wait_for_approval("ok", approvers="testapp.aprove_refund")

    @registered("tests.mistakes.no_group")
    def no_group(ctx):
        return ctx.wait_for_approval("ok", approvers={"group": "refund managers"})

    problems = durable.describe(typo_permission)["problems"]
    assert len(problems) == 1 and "'testapp.aprove_refund'" in problems[0]
    assert any("testapp.aprove_refund" in error.msg and error.id == "django_durable.E011"
               for error in checks.check_workflow_shapes())

    runs = [durable.start(typo_permission), durable.start(no_group)]
    drain()
    first, second = (WorkflowRun.objects.get(pk=run.pk) for run in runs)
    assert first.status == "failed" and "'testapp.aprove_refund'" in first.get_error()["message"]
    assert second.status == "failed" and "'refund managers'" in second.get_error()["message"]
    assert not first.approvals.exists() and not second.approvals.exists()

    Group.objects.create(name="refund managers")  # once it exists, the approval opens
    later = durable.start(no_group)
    drain()
    assert WorkflowRun.objects.get(pk=later.pk).status == "waiting" and later.approvals.count() == 1


@pytest.fixture
def ops(django_user_model):
    django_user_model.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    token = base64.b64encode(b"ops:a-long-password").decode()
    return {"HTTP_AUTHORIZATION": f"Basic {token}"}


def test_a_signal_no_code_waits_for_is_kept_with_a_warning(ops):
    run = durable.start("tests.approval")
    drain()
    http = Client(enforce_csrf_checks=True)
    typo = http.post(f"/api/durable/workflows/{run.pk}/signals/aproved/", {"payload": {"by": "ann"}},
                     content_type="application/json", **ops)
    assert typo.status_code == 202
    assert "'aproved'" in typo.json()["warning"] and "'approved'" in typo.json()["warning"]
    out, err = io.StringIO(), io.StringIO()
    call_command("durable", "signal", str(run.pk), "aproved", stdout=out, stderr=err)
    assert "warning: The workflow 'tests.approval' never waits for a signal 'aproved'" in err.getvalue()
    right = http.post(f"/api/durable/workflows/{run.pk}/signals/approved/", {"payload": {"by": "ann"}},
                      content_type="application/json", **ops)
    assert right.status_code == 202 and right.json()["warning"] is None
    drain()
    assert durable.get_run(run.pk).status == "completed"

    page = Client()
    page.login(username="ops", password="a-long-password")
    waiting = durable.start("tests.approval")
    form = page.get(f"/admin/django_durable/workflowrun/{waiting.pk}/do/signal/").content.decode()
    assert '<datalist id="durable-name-choices"><option value="approved"></datalist>' in form
    assert 'list="durable-name-choices"' in form


def test_a_queue_nobody_serves_is_said_so(ops, caplog):
    Worker.objects.create(name="w1:1", host="w1", pid=1, queues="default", started_at=timezone.now(),
                          last_seen=timezone.now())
    http = Client(enforce_csrf_checks=True)
    typo = http.post("/api/durable/workflows/", {"workflow": "tests.three_steps", "queue": "deafult"},
                     content_type="application/json", **ops)
    assert typo.status_code == 201 and "'deafult'" in typo.json()["warning"]
    assert "No live worker serves the queue 'deafult'" in caplog.text
    usual = http.post("/api/durable/workflows/", {"workflow": "tests.three_steps", "queue": "default"},
                      content_type="application/json", **ops)
    assert usual.status_code == 201 and usual.json()["warning"] is None

    out, err = io.StringIO(), io.StringIO()
    call_command("durable", "start", "tests.three_steps", "--queue", "deafult", stdout=out, stderr=err)
    assert "warning: No live worker serves the queue 'deafult'" in err.getvalue()

    page = Client()
    page.login(username="ops", password="a-long-password")
    overview = page.get("/admin/django_durable/overview/").content.decode()
    assert overview.count("no worker serves this queue") == 1 and "--queues deafult" in overview


@pytest.mark.django_db(transaction=True)
def test_an_unknown_workflow_name_suggests_the_closest_registered_one(admin_client):
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(durable.WorkflowNotFound, match=r"Did you mean 'tests\.three_steps'\?"):
        durable.start("tests.three_step")
    answer = admin_client.post("/api/durable/workflows/", {"workflow": "tests.three_step"},
                               content_type="application/json")
    assert answer.status_code == 400 and "Did you mean 'tests.three_steps'?" in answer.content.decode()
    assert b"tests.three_step'" not in answer.content.replace(b"tests.three_steps'", b"")  # the name is not echoed
    with pytest.raises(CommandError, match=r"Did you mean 'tests\.three_steps'\?"):
        call_command("durable", "start", "tests.three_step", stdout=io.StringIO())
    with pytest.raises(durable.WorkflowNotFound) as nothing_close:
        durable.start("zzz")
    assert "Did you mean" not in str(nothing_close.value)
