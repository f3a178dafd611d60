"""manage.py durable: every subcommand, its output and its exit code."""

import datetime as dt
import io
import json
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

import django_durable as durable
from django_durable import schedules
from django_durable.models import Schedule, Step, WorkflowEvent, WorkflowRun, WorkItem
from django_durable.testing import drain
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def durable_cli(*args) -> str:
    out = io.StringIO()
    call_command("durable", *args, stdout=out)
    return out.getvalue()


def exit_code(*args) -> int:
    with pytest.raises(CommandError) as info:
        durable_cli(*args)
    return info.value.returncode


def test_start_status_and_list():
    out = durable_cli("start", "tests.three_steps", "--kwargs", '{"x": 3}')
    run = WorkflowRun.objects.get()
    assert out.startswith(f"{run.pk} tests.three_steps: pending")
    assert WorkflowEvent.objects.get(run=run).actor.startswith("cli:")
    drain()
    status = durable_cli("status", str(run.pk), "--steps")
    assert "completed" in status and "result: [3,4,5]" in status and "steps: 3 completed" in status
    assert "   1 a" in status
    data = json.loads(durable_cli("status", str(run.pk), "--json"))
    assert (data["status"], data["result"], data["step_counts"]) == ("completed", [3, 4, 5], {"completed": 3})
    durable.start("tests.approval", queue="slow")
    drain()
    listed = json.loads(durable_cli("list", "--json"))
    assert [r["workflow"] for r in listed] == ["tests.approval", "tests.three_steps"]
    line = durable_cli("list", "--status", "waiting", "--queue", "slow").strip()
    assert "tests.approval" in line
    short = line.split()[0]  # the admin's short id, which the other commands take
    assert len(short) == 8 and short in durable_cli("status", short)
    assert "tests.approval" not in durable_cli("list", "--workflow", "tests.three_steps")


def test_start_options():
    durable_cli("start", "tests.approval", "--idempotency-key", "k1", "--queue", "q", "--priority", "3",
                "--delay", "60", "--json")
    durable_cli("start", "tests.approval", "--idempotency-key", "k1")
    run = WorkflowRun.objects.get()
    assert (run.queue, run.priority, run.status, run.scheduled_at is not None) == ("q", 3, "pending", True)


def test_exit_codes_for_bad_input_unknown_things_and_refusals():
    assert exit_code("start", "os.system") == 3
    assert exit_code("start", "tests.three_steps", "--args", "[1,") == 2
    assert exit_code("start", "tests.three_steps", "--args", '{"a": 1}') == 2
    assert exit_code("status", "not-a-uuid") == 3
    assert exit_code("status", "6a3b2c1d-0000-4000-8000-000000000000") == 3
    assert exit_code("list", "--status", "nope") == 2
    done = durable.start("tests.three_steps")
    drain()
    assert exit_code("cancel", str(done.pk)) == 1
    assert exit_code("retry", str(done.pk)) == 1
    assert exit_code("signal", str(done.pk), "go") == 1
    assert exit_code("schedules", "pause", "no-such-schedule") == 3
    assert exit_code("schedules", "pause") == 2
    assert exit_code("prune", "--older-than", "a while") == 2
    assert not WorkflowRun.objects.exclude(pk=done.pk).exists()


def test_start_and_wait():
    assert exit_code("start", "tests.approval", "--wait", "0.2") == 4  # no worker here: it waits in vain


def test_cancel_signal_and_retry(tmp_path):
    waiting = durable.start("tests.approval")
    other = durable.start("tests.approval")
    drain()
    assert durable_cli("signal", str(waiting.pk), "approved", "--payload", '{"ok": true}').startswith("signal 'approved'")
    assert exit_code("signal", str(waiting.pk), "approved", "--payload", "{bad") == 2
    drain()
    assert WorkflowRun.objects.get(pk=waiting.pk).get_result() == {"ok": True}
    assert durable_cli("cancel", str(other.pk), "--reason", "test").strip() == f"{other.pk} cancelled"
    assert durable_cli("cancel", str(other.pk)).strip() == f"{other.pk} cancelled"  # again: fine
    flag = tmp_path / "broken"
    flag.touch()
    flaky = durable.start("tests.flaky_middle", str(flag))
    drain()
    flag.unlink()
    assert "goes again" in durable_cli("retry", str(flaky.pk))
    drain()
    assert WorkflowRun.objects.get(pk=flaky.pk).status == "completed"


def test_schedules():
    schedules.ensure_schedule("hourly", "tests.tick", cron="0 * * * *")
    assert "hourly" in durable_cli("schedules") and "0 * * * *" in durable_cli("schedules", "list")
    assert durable_cli("schedules", "pause", "hourly").strip() == "hourly paused"
    assert durable_cli("schedules", "resume", "hourly").strip() == "hourly active"
    assert "started run" in durable_cli("schedules", "trigger", "hourly")
    assert Schedule.objects.get().last_run is not None
    assert "declared schedule(s) in place" in durable_cli("schedules", "sync")
    assert {s["slug"] for s in json.loads(durable_cli("schedules", "--json"))} == {"hourly", "tests.nightly", "orders.nightly_report",
                                                                            "durable.prune"}


def test_prune_deletes_old_finished_runs_in_batches_and_keeps_the_rest(settings):
    settings.DURABLE_RETENTION = dt.timedelta(days=7)
    old = [durable.start("tests.three_steps") for _ in range(5)]
    recent = durable.start("tests.three_steps")
    waiting = durable.start("tests.approval")
    drain()
    long_ago = timezone.now() - dt.timedelta(days=30)
    WorkflowRun.objects.filter(pk__in=[r.pk for r in old]).update(finished_at=long_ago, created_at=long_ago)
    WorkflowRun.objects.filter(pk=waiting.pk).update(created_at=long_ago)  # old, but not finished
    assert "5 finished run(s) past their retention (DURABLE_RETENTION: 7 d, or their workflow's own) would be " \
        "deleted." in durable_cli("prune", "--dry-run")
    assert WorkflowRun.objects.count() == 7
    assert "deleted 5 finished run(s)" in durable_cli("prune", "--batch", "2")
    assert set(WorkflowRun.objects.values_list("pk", flat=True)) == {recent.pk, waiting.pk}
    assert not Step.objects.filter(run_id__in=[r.pk for r in old]).exists()
    assert not WorkItem.objects.filter(run_id__in=[r.pk for r in old]).exists()
    assert "deleted 1 finished run(s) older than 0 ms" in durable_cli("prune", "--older-than", "0")
    assert list(WorkflowRun.objects.values_list("pk", flat=True)) == [waiting.pk]


def test_stats():
    durable.start("tests.three_steps")
    durable.start("tests.approval")
    durable.start("tests.raises")
    drain()
    durable.start("tests.three_steps")  # ready, not claimed
    text = durable_cli("stats")
    assert "unfinished: 1 pending, 0 running, 1 waiting" in text
    assert "finished in the last hour: 1 completed, 1 failed, 0 cancelled" in text
    assert "queue default: 1 ready" in text
    assert "throughput: 0.03 runs finished a minute" in text
    data = json.loads(durable_cli("stats", "--json"))
    assert data["finished_last_day"] == {"completed": 1, "failed": 1, "cancelled": 0}
    assert data["queues"][0]["queue"] == "default" and data["workers"] == {"live": 0, "stale": 0}


@pytest.mark.every_django
def test_the_exit_codes_reach_the_shell(worker_env):
    """Through manage.py in a real process, as a shell script runs it."""

    def run(*args):
        return subprocess.run([sys.executable, str(ROOT / "manage.py"), "durable", *args], cwd=ROOT,
                              env=worker_env, capture_output=True, text=True, timeout=60)

    missing = run("status", "not-a-uuid")
    assert missing.returncode == 3 and "No workflow run has the id" in missing.stderr
    started = run("start", "tests.approval", "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["id"]
    assert run("cancel", run_id).returncode == 0
    assert run("cancel", run_id).returncode == 0
    assert WorkflowRun.objects.get(pk=run_id).status == "cancelled"
    assert run("retry", "00000000-0000-4000-8000-000000000000").returncode == 3
    assert run("start", "tests.three_steps", "--kwargs", "[").returncode == 2


@pytest.mark.django_db(transaction=True)
def test_status_counts_steps_apart_from_the_other_journal_entries():
    from tests.test_context_contract import streams_then_approval

    run = durable.start(streams_then_approval, question="a b c d")
    drain()
    out = io.StringIO()
    call_command("durable", "status", str(run.pk), stdout=out)
    text = out.getvalue()
    # (This workflow's approval clashes with its step on purpose: the run fails there.)
    assert "steps: 2 completed" in text, text  # the answer and the refund
    assert "other journal entries: 5 stream values" in text, text  # four tokens and the close


def test_a_cancelled_run_shows_its_open_entries_stopped_on_the_command_line_and_over_http(admin_user):
    from rest_framework.test import APIClient

    run = durable.start("tests.retry_after_backoff", backoff=3600)
    drain()
    assert "steps: 1 retrying" in durable_cli("status", str(run.pk))
    durable.cancel(run.pk, "no longer needed")
    assert Step.objects.get(run=run).status == "retrying"  # the journal keeps it as it was (a retry resumes it)

    text = durable_cli("status", str(run.pk), "--steps")
    assert "retrying" not in text and "steps: 1 stopped" in text, text
    data = json.loads(durable_cli("status", str(run.pk), "--steps", "--json"))
    assert data["step_counts"] == {"stopped": 1} and data["steps"][0]["status"] == "stopped"

    api = APIClient()
    api.force_authenticate(admin_user)
    shown = api.get(f"/api/durable/workflows/{run.pk}/?include=steps").json()
    assert shown["steps"] == {"stopped": 1} and shown["journal"][0]["status"] == "stopped"
