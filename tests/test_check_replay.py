"""`durable check_replay`: the runs in flight the code installed now would break, named before a deploy;
ctx.patched() lets one version finish old and new runs alike."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

import django_durable as durable
from django_durable.models import WorkflowRun
from django_durable.replaycheck import check_replay
from django_durable.testing import drain
from tests.conftest import ledger_counts
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)

version = {"code": "v1"}


def do(run_id, name, how="post"):
    ledger.record(run_id, name)
    return name


def other(run_id, name):  # the same step, another function
    ledger.record(run_id, name)
    return name


@durable.workflow("tests.replaycheck.order")
def order(ctx):
    code = version["code"]
    ctx.step("a", do, ctx.run_id, "a")
    ctx.wait_for_signal("first")
    if code == "inserted" or (code == "patched" and ctx.patched("x")):
        ctx.step("x", do, ctx.run_id, "x")
    if code == "argument":
        ctx.step("b", do, ctx.run_id, "b", how="express")
    elif code != "removed":
        ctx.step("b", other if code == "renamed" else do, ctx.run_id, "b")
    ctx.wait_for_signal("second")
    ctx.step("c", do, ctx.run_id, "c")
    return code


def twenty_runs():
    """10 runs past b, waiting for "second"; 10 waiting for "first"."""
    version["code"] = "v1"
    runs = [durable.start(order) for _ in range(20)]
    drain()
    for run in runs[:10]:
        durable.signal(run.pk, "first")
    drain()
    return runs[:10], runs[10:]


def broken(code):
    version["code"] = code
    return {v.run_id for v in check_replay() if not v.ok}


def test_check_replay_names_exactly_the_runs_each_change_would_break():
    past_b, before_first = twenty_runs()
    past = {str(run.pk) for run in past_b}
    assert broken("v1") == set()
    assert broken("inserted") == past       # x before b, which they recorded
    assert broken("removed") == past        # b recorded, no longer reached
    assert broken("renamed") == past        # b recorded for another function
    assert broken("argument") == past       # b recorded with other arguments
    assert broken("patched") == set()       # old runs keep the old path
    version["code"] = "removed"
    reasons = {v.reason for v in check_replay() if not v.ok}
    assert reasons == {"the journal holds 'b', which the code no longer reaches before it reaches 'a wait'"}
    version["code"] = "argument"
    reasons = {v.reason.split(" (now")[0] for v in check_replay() if not v.ok}
    assert reasons == {"NonDeterminismError: Step 'b' was recorded with other arguments than the workflow code now "
                       "passes to tests.test_check_replay.do"}


def test_patched_finishes_old_and_new_runs_correctly():
    past_b, before_first = twenty_runs()
    version["code"] = "patched"  # the deploy
    new = durable.start(order)
    drain()
    for run in [*before_first, new]:
        durable.signal(run.pk, "first")
    drain()
    for run in [*past_b, *before_first, new]:
        durable.signal(run.pk, "second")
    drain()
    assert all(r.status == "completed" for r in WorkflowRun.objects.all())
    assert all(ledger_counts(run.pk) == {"a": 1, "b": 1, "c": 1} for run in past_b)
    assert all(ledger_counts(run.pk) == {"a": 1, "x": 1, "b": 1, "c": 1} for run in [*before_first, new])


def test_the_command_and_the_deploy_check_fail_when_a_run_would_break(settings):
    twenty_runs()
    version["code"] = "removed"
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("durable", "check_replay", stdout=out)
    assert failed.value.returncode == 1
    assert "20 run(s) checked, 10 would not replay on this code." in out.getvalue()
    from django.core import checks

    # With the default settings, as the deploy step in the docs runs it.
    assert not hasattr(settings, "DURABLE_CHECK_REPLAY")
    errors = [e for e in checks.run_checks(include_deployment_checks=True, tags=["durable"])
              if e.id == "django_durable.E010"]
    assert len(errors) == 10
    assert not [e for e in checks.run_checks(tags=["durable"]) if e.id == "django_durable.E010"]  # not without --deploy
    settings.DURABLE_CHECK_REPLAY = False
    assert not [e for e in checks.run_checks(include_deployment_checks=True, tags=["durable"])
                if e.id == "django_durable.E010"]
    del settings.DURABLE_CHECK_REPLAY
    version["code"] = "v1"
    call_command("durable", "check_replay", "--workflow", "tests.replaycheck.order", stdout=io.StringIO())


def test_the_deploy_check_warns_when_it_cannot_read_the_database(monkeypatch):
    from django.core import checks
    from django.db import OperationalError

    from django_durable import replaycheck

    def unreachable(**kwargs):
        raise OperationalError('connection to server at "db" (10.0.0.5), port 5432 failed: timeout expired')
        yield

    monkeypatch.setattr(replaycheck, "check_replay", unreachable)
    (warning,) = [e for e in checks.run_checks(include_deployment_checks=True, tags=["durable"])
                  if e.id in ("django_durable.W006", "django_durable.E010")]
    assert warning.id == "django_durable.W006" and "were not replayed" in warning.msg
    assert "port 5432 failed" in warning.msg
