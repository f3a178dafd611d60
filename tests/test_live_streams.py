"""Values a step writes to its run's streams while it runs (durable.current_step().write_stream()):
read before the step returns, and never repeated by a retry without the reader being told."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connections
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import Step, WorkflowRun
from django_durable.testing import drain
from tests.harness.workers import wait_for
from tests.test_streams import frames

WORDS = ["w0", "w1", "w2"]


def _drain_in_thread() -> tuple[threading.Thread, list]:
    errors: list = []

    def work():
        try:
            drain()
        except Exception as exc:  # noqa: BLE001 - asserted by the test
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=work)
    thread.start()
    return thread, errors


@pytest.mark.timeout(120)
def test_a_running_steps_values_are_read_before_it_returns(transactional_db, tmp_path):
    run = durable.start("tests.speaker", WORDS, hold_dir=str(tmp_path), hold_at=0)
    thread, errors = _drain_in_thread()
    try:
        values = durable.read_stream(run.pk, "tokens", timeout=60)
        assert next(values) == "w0"
        # The step is still running: it waits for "go", which only this test creates. (It says
        # so just after the value commits, which a reader may see first.)
        wait_for(lambda: (tmp_path / "held").exists(), timeout=60, message="the step waiting for go")
        assert not Step.objects.filter(run=run, key="answer").exists()
    finally:
        (tmp_path / "go").touch()
        thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    assert list(values) == ["w1", "w2", "[done]"]
    assert durable.wait(run.pk, timeout=1) == "w0 w1 w2"
    answer = Step.objects.get(run=run, key="answer")
    live = Step.objects.filter(run=run, kind="stream", key__startswith="live:").order_by("seq")
    assert [v.seq for v in live] == sorted(v.seq for v in live) and max(v.seq for v in live) < answer.seq


def test_a_retried_step_says_its_earlier_attempts_values_were_abandoned(db):
    run = durable.start("tests.speaker", WORDS, fail_after=2)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "w0 w1 w2"
    read = list(durable.read_stream(run.pk, "tokens"))
    assert read == ["w0", "w1", durable.AbandonedValues("answer", attempt=1, delivery=1, values=2),
                    "w0", "w1", "w2", "[done]"]


def test_the_event_stream_tags_each_value_with_its_attempt_and_marks_the_abandoned(db, admin_user):
    run = durable.start("tests.speaker", WORDS, fail_after=1)
    drain()
    client = APIClient()
    client.force_authenticate(admin_user)
    seen = [json.loads(data) for _, event, data in
            frames(client.get(f"/api/durable/workflows/{run.pk}/stream/", HTTP_ACCEPT="text/event-stream"))
            if event == "stream"]
    assert [(s.get("value"), s.get("step"), s.get("attempt")) for s in seen] == [
        ("w0", "answer", 1), (None, None, None), ("w0", "answer", 2), ("w1", "answer", 2), ("w2", "answer", 2),
        ("[done]", None, None)]
    assert seen[1]["abandoned"] == {"step": "answer", "attempt": 1, "delivery": 1, "values": 1}


def test_a_replay_counts_a_steps_values_as_reached(db):
    """The live entries are in the journal, where no workflow code reaches them: the replay check
    passes the run, and a later patched() still sees the run as new code."""
    from django_durable.replaycheck import check_run

    run = durable.start("tests.speaker", WORDS, fail_after=2)
    drain()
    verdict = check_run(WorkflowRun.objects.get(pk=run.pk))
    assert verdict.ok, verdict


def test_an_async_step_writes_with_await(transactional_db):
    """(Its writes go through Django's thread for sync code, on a connection of their own, as the
    async ORM's do: they need the run committed, hence a transactional test.)"""
    run = durable.start("tests.speaker", WORDS, asynchronous=True)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == "w0 w1 w2"
    assert list(durable.read_stream(run.pk, "tokens")) == [*WORDS, "[done]"]


def _write_in_atomic_step():
    durable.current_step().write_stream("tokens", "x")


@durable.workflow("tests.live_in_atomic", retry=durable.RetryPolicy(max_attempts=1))
def live_in_atomic(ctx):
    ctx.step("atomic", _write_in_atomic_step, atomic=True)


def _write_sync_in_async():
    async def inner():
        durable.current_step().write_stream("tokens", "x")
    return inner()


@durable.workflow("tests.sync_write_in_async", retry=durable.RetryPolicy(max_attempts=1))
def sync_write_in_async(ctx):
    ctx.step("async", _write_sync_in_async)


def _write_in_branch():
    durable.current_step().write_stream("tokens", "x")


@durable.workflow("tests.live_in_branch")
def live_in_branch(ctx):
    ctx.parallel([ctx.call("one", _write_in_branch, retry=durable.RetryPolicy(max_attempts=1))])


@pytest.mark.parametrize("workflow, message", [
    ("tests.live_in_atomic", "cannot write to its run's streams while it runs: it is atomic"),
    ("tests.live_in_branch", "or a parallel branch"),
    ("tests.sync_write_in_async", "awrite_stream"),
])
def test_a_write_where_it_cannot_be_live_is_refused(db, workflow, message):
    run = durable.start(workflow)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "failed"
    assert message in WorkflowRun.objects.get(pk=run.pk).error
    assert not Step.objects.filter(run=run, kind="stream").exists()


_raised: list = []


def _write_after_losing_the_claim():
    import uuid

    from django_durable.models import WorkItem

    info = durable.current_step()
    info.write_stream("tokens", "before")
    WorkItem.objects.filter(run_id=info.run_id).update(claim_token=uuid.uuid4())  # another worker took it
    try:
        info.write_stream("tokens", "after")
    except BaseException as exc:  # LeaseLost is no Exception: code's own `except Exception` lets it by
        _raised.append(exc)
        raise


@durable.workflow("tests.live_lost_claim")
def live_lost_claim(ctx):
    ctx.step("lost", _write_after_losing_the_claim)


def test_a_worker_that_lost_its_claim_writes_nothing_more(db):
    _raised.clear()
    run = durable.start("tests.live_lost_claim")
    drain()
    values = Step.objects.filter(run=run, kind="stream").order_by("seq")
    assert [v.get_result()["value"] for v in values] == ["before"]
    assert [type(exc).__name__ for exc in _raised] == ["LeaseLost"]
    assert WorkflowRun.objects.get(pk=run.pk).status == "running"  # left to the worker that holds it


def test_outside_a_step_there_is_nothing_to_write_to():
    assert durable.current_step() is None


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_worker_killed_mid_stream_leaves_a_marked_attempt_and_the_next_one_whole(start_worker, tmp_path):
    """RELIABILITY T51: SIGKILL while a step is writing; the next worker's attempt starts with a
    marker for the values the dead attempt wrote, and every value is in the journal once."""
    run = durable.start("tests.speaker", [f"w{i}" for i in range(5)], hold_dir=str(tmp_path), hold_at=2)
    first = start_worker(burst=False)
    wait_for((tmp_path / "held").exists, timeout=60, message="the step to write three values")
    first.kill()
    (tmp_path / "go").touch()  # nobody waits for it now; the next execution does not hold
    second = start_worker()
    assert second.wait() == 0, second.log()
    assert durable.wait(run.pk, timeout=1) == "w0 w1 w2 w3 w4"
    read = list(durable.read_stream(run.pk, "tokens"))
    assert read[:4] == ["w0", "w1", "w2", durable.AbandonedValues("answer", attempt=1, delivery=1, values=3)]
    assert read[4:] == ["w0", "w1", "w2", "w3", "w4", "[done]"]
