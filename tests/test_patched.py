"""ctx.patched(): runs recorded under the old code finish on the old path, new ones take the new one."""

import pytest

import django_durable as durable
from django_durable.models import Step, WorkflowRun
from django_durable.testing import drain
from tests.conftest import ledger_counts, replay_again
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)

deployed = {"new": False}


def do(run_id, name):
    ledger.record(run_id, name)
    return name


@durable.workflow("tests.patched.ship")
def ship(ctx):
    ctx.step("pack", do, ctx.run_id, "pack")
    ctx.now()  # a recorded value before the change point: reached, not history ahead
    if deployed["new"]:
        route = "express" if ctx.patched("express") else "post"
    else:
        route = "post"
    ctx.step(f"ship-{route}", do, ctx.run_id, f"ship-{route}")
    ctx.wait_for_signal("delivered")
    return route


@durable.workflow("tests.patched.before")
def waits_first(ctx):
    ctx.wait_for_signal("go")
    if deployed["new"]:
        return "new" if ctx.patched("express") else "old"
    return "old"


def finish(run):
    durable.signal(run.pk, "delivered")
    drain()
    return WorkflowRun.objects.get(pk=run.pk).get_result()


def test_old_runs_keep_the_old_path_and_new_runs_take_the_new_one():
    deployed["new"] = False
    old = durable.start(ship)
    drain()  # packed, shipped by post, waiting for the delivery
    deployed["new"] = True  # the deploy
    new = durable.start(ship)
    drain()
    assert finish(old) == "post" and finish(new) == "express"
    assert ledger_counts(old.pk) == {"pack": 1, "ship-post": 1}
    assert ledger_counts(new.pk) == {"pack": 1, "ship-express": 1}
    assert not Step.objects.filter(run=old, kind="patch").exists()
    marker = Step.objects.get(run=new, kind="patch")
    assert (marker.key, marker.name) == ("patch:express", "express")


def test_a_run_waiting_before_the_change_point_takes_the_new_path():
    deployed["new"] = False
    run = durable.start(waits_first)
    drain()
    deployed["new"] = True
    durable.signal(run.pk, "go")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "new"


def test_the_answer_is_kept_across_replays():
    deployed["new"] = True
    run = durable.start(ship)
    drain()
    # Replay the whole journal from the start, as a new worker would after a crash.
    replay_again(run.pk, result=None)
    drain()
    assert finish(run) == "express"
    assert ledger_counts(run.pk) == {"pack": 1, "ship-express": 1}
