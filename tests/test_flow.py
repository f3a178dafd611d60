"""ctx.switch(), ctx.note(), ctx.set_progress() and ctx.emit(): recorded once, replayed, never repeated."""


import pytest

import django_durable as durable
from django_durable import signals
from django_durable.models import SignalMessage, Step, WorkflowRun
from django_durable.testing import drain
from tests.conftest import assert_settled, ledger_counts
from tests.testapp import ledger
from tests.test_engine import SimulatedCrash, expire_claims

pytestmark = pytest.mark.django_db(transaction=True)

asked: list = []  # (run id, matcher) for each time a matcher was asked
crash_in: set = set()


def step(run_id, name):
    ledger.record(run_id, name)
    if name in crash_in:
        crash_in.discard(name)
        raise SimulatedCrash(name)
    return name


def is_premium(run_id):
    def match(tier):
        asked.append((str(run_id), "premium"))
        return tier == "premium"
    return match


@durable.workflow("tests.flow.route")
def route(ctx, tier):
    def express(value):
        ctx.step("express", step, ctx.run_id, "express")
        ctx.step("express-label", step, ctx.run_id, "express-label")
        return f"express for {value}"

    def standard(value):
        return ctx.step("standard", step, ctx.run_id, "standard")

    def review(value):
        return ctx.step("review", step, ctx.run_id, "review")

    chosen = ctx.switch("route", tier, {"premium": (is_premium(ctx.run_id), express),
                                        "standard": ("standard", standard)}, default=("manual-review", review))
    ctx.step("done", step, ctx.run_id, "done")
    return chosen


def crash_then_resume():
    with pytest.raises(SimulatedCrash):
        drain()
    expire_claims()
    durable.workpool.reap(db="default")
    drain()


def test_switch_takes_the_matching_branch_and_records_it():
    premium, standard, other = (durable.start(route, tier) for tier in ("premium", "standard", "gold"))
    drain()
    results = {run.pk: WorkflowRun.objects.get(pk=run.pk).get_result() for run in (premium, standard, other)}
    assert results == {premium.pk: "express for premium", standard.pk: "standard", other.pk: "review"}
    entry = Step.objects.get(run=premium, key="route")
    assert (entry.kind, entry.name, entry.status, entry.result) == ("switch", "premium", "completed",
                                                                    '"express for premium"')
    assert Step.objects.get(run=other, key="route").name == "manual-review"


def test_a_replay_goes_down_the_recorded_branch_without_asking_the_matchers():
    asked.clear()
    run = durable.start(route, "premium")
    crash_in.add("express-label")  # the worker dies inside the branch, after its first step
    crash_then_resume()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "express for premium"
    assert asked == [(str(run.pk), "premium")]  # asked once, on the first pass only
    assert ledger_counts(run.pk) == {"express": 1, "express-label": 2, "done": 1}


def test_a_finished_switch_replays_its_result_without_running_the_branch():
    asked.clear()
    run = durable.start(route, "premium")
    crash_in.add("done")  # after the switch returned
    crash_then_resume()
    assert ledger_counts(run.pk) == {"express": 1, "express-label": 1, "done": 2}
    assert asked == [(str(run.pk), "premium")]


def test_no_matching_branch_without_a_default_fails_the_run_clearly():
    @durable.workflow("tests.flow.strict")
    def strict(ctx, value):
        return ctx.switch("pick", value, {"a": ("a", lambda v: 1)})

    run = durable.start(strict, "b")
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "failed"
    assert run.get_error()["type"].endswith("NoBranchMatched")
    assert "no branch fits 'b'" in run.get_error()["message"]
    assert not Step.objects.filter(run=run, key="pick").exists()


def test_a_recorded_branch_the_code_no_longer_has_is_a_nondeterminism_error():
    @durable.workflow("tests.flow.changing")
    def changing(ctx):
        branches = {"old": ("x", lambda v: ctx.step("wait", step, ctx.run_id, "wait"))} if not renamed else \
            {"new": ("x", lambda v: 2)}
        return ctx.switch("pick", "x", branches)

    renamed = False
    run = durable.start(changing)
    crash_in.add("wait")
    with pytest.raises(SimulatedCrash):
        drain()
    renamed = True
    expire_claims()
    durable.workpool.reap(db="default")
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "blocked" and "went down branch 'old'" in run.waiting_on


def test_bad_branches_are_refused():
    @durable.workflow("tests.flow.malformed")
    def malformed(ctx):
        return ctx.switch("pick", 1, {"a": lambda v: v})

    run = durable.start(malformed)
    drain()
    assert "must be a string id mapped to (match, run)" in WorkflowRun.objects.get(pk=run.pk).get_error()["message"]


@durable.workflow("tests.flow.reporting")
def reporting(ctx, files):
    ctx.note("Started", files=len(files))
    for index, name in enumerate(files, 1):
        ctx.step(f"copy:{name}", step, ctx.run_id, name)
        ctx.set_progress(index, len(files), f"copied {name}")
    ctx.note("All copied")
    return len(files)


def test_notes_and_progress_are_recorded_once_and_signalled_once():
    noted, progressed = [], []

    def on_note(sender, run_id, message, data, **kwargs):
        noted.append((message, data))

    def on_progress(sender, run_id, done, total, message, **kwargs):
        progressed.append((done, total, message))

    signals.run_noted.connect(on_note)
    signals.run_progress.connect(on_progress)
    try:
        run = durable.start(reporting, ["a", "b", "c"])
        crash_in.add("c")  # dies in the last copy: notes and progress so far replay
        crash_then_resume()
    finally:
        signals.run_noted.disconnect(on_note)
        signals.run_progress.disconnect(on_progress)
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "completed"
    assert [(n["key"], n["message"], n["data"]) for n in run.notes()] == [
        ("note:0", "Started", {"files": 3}), ("note:1", "All copied", {})]
    assert run.progress() == {"done": 3, "total": 3, "message": "copied c"}
    assert Step.objects.filter(run=run, kind="progress").count() == 1
    assert noted == [("Started", {"files": 3}), ("All copied", {})]
    # Each value once; "b" committed before the step "c" started (its checkpoint), so it is not set again.
    assert progressed == [(1, 3, "copied a"), (2, 3, "copied b"), (3, 3, "copied c")]
    assert run.step_counts() == {"completed": 5}  # 3 copies and 2 notes; the progress is not a step


def test_progress_is_checked():
    @durable.workflow("tests.flow.bad_progress")
    def bad_progress(ctx):
        ctx.set_progress("half")

    run = durable.start(bad_progress)
    drain()
    assert "Progress done must be a number" in WorkflowRun.objects.get(pk=run.pk).get_error()["message"]


@durable.workflow("tests.flow.ships")
def ships(ctx, order_id):
    ctx.step("ship", step, ctx.run_id, "ship")
    delivered = ctx.emit("order.shipped", {"order": order_id})
    ctx.step("after", step, ctx.run_id, "after")
    return delivered


def test_emit_delivers_to_waiting_runs_and_signals_once_however_often_the_code_replays():
    emitted = []

    def on_emit(sender, run_id, name, payload, delivered, **kwargs):
        emitted.append((name, payload, delivered))

    waiting = durable.start("tests.awaits_shipping", 7)
    other = durable.start("tests.awaits_shipping", 8)
    drain()
    signals.run_emitted.connect(on_emit)
    try:
        shipper = durable.start(ships, 7)
        crash_in.add("after")  # after the emit committed: the replay must not deliver it again
        crash_then_resume()
    finally:
        signals.run_emitted.disconnect(on_emit)
    assert WorkflowRun.objects.get(pk=shipper.pk).get_result() == 1
    assert emitted == [("order.shipped", {"order": 7}, 1)]
    assert SignalMessage.objects.filter(run=waiting, kind="event").count() == 1
    assert WorkflowRun.objects.get(pk=waiting.pk).get_result() == {"order": 7}
    assert WorkflowRun.objects.get(pk=other.pk).status == "waiting"
    entry = Step.objects.get(run=shipper, key="emit:order.shipped:0")
    assert (entry.kind, entry.name, entry.status) == ("emit", "order.shipped", "completed")
    assert ledger_counts(shipper.pk) == {"ship": 1, "after": 2}


@pytest.mark.slow
def test_a_worker_killed_right_after_an_emit_commits_does_not_deliver_it_twice(start_worker):
    waiting = durable.start("tests.awaits_shipping", 5)
    shipper = durable.start("tests.ships_and_tells", 5)
    first = start_worker(faults="after_checkpoint_commit=kill@emit:order.shipped:0")
    assert first.wait() == -9, first.log()
    assert Step.objects.get(run=shipper, key="emit:order.shipped:0").status == "completed"
    second = start_worker()
    assert second.wait() == 0, second.log()
    assert WorkflowRun.objects.get(pk=shipper.pk).get_result() == 1
    assert WorkflowRun.objects.get(pk=waiting.pk).get_result() == {"order": 5}
    assert SignalMessage.objects.filter(run=waiting, kind="event").count() == 1
    assert ledger_counts(shipper.pk) == {"ship": 1, "after": 1}
    assert_settled()


def test_the_api_returns_progress_to_readers_and_note_data_only_with_payloads(django_user_model):
    from django.contrib.auth.models import Permission
    from rest_framework.test import APIClient

    run = durable.start(reporting, ["a", "b"])
    drain()

    def reader(*codenames):
        person = django_user_model.objects.create_user(f"reader-{len(codenames)}", password="pw", is_staff=True)
        person.user_permissions.set(Permission.objects.filter(content_type__app_label="django_durable",
                                                              codename__in=codenames))
        client = APIClient()
        client.force_authenticate(person)
        return client.get(f"/api/durable/workflows/{run.pk}/").json()

    plain = reader("view_workflowrun")
    assert plain["progress"] == {"done": 2, "total": 2, "message": "copied b"}
    assert [(n["key"], n["message"], n["data"]) for n in plain["notes"]] == [
        ("note:0", "Started", None), ("note:1", "All copied", None)]
    full = reader("view_workflowrun", "view_payload_workflowrun")
    assert [n["data"] for n in full["notes"]] == [{"files": 2}, {}]
    assert full["steps"] == {"completed": 4}


def test_the_admin_draws_notes_and_progress_on_the_timeline(admin_client):
    run = durable.start(reporting, ["a"])
    drain()
    page = admin_client.get(f"/admin/django_durable/workflowrun/{run.pk}/change/").content.decode()
    assert "<title>Started</title>" in page and "<title>progress 1 of 1: copied a</title>" in page
    # The progress entry stays `running` to be updated in place; the finished run does not call it stopped.
    assert "the run ended while it was" not in page
