"""`durable export RUN_ID` and durable.testing.load_run(): a run from one database replayed in a test."""

import io
import json

import pytest
from django.core.management import call_command

import django_durable as durable
from django_durable.models import SignalMessage, Step, WorkflowRun, WorkItem
from django_durable.testing import drain, load_run
from tests.conftest import ledger_counts
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)

broken = {"yes": True}


def do(run_id, name):
    ledger.record(run_id, name)
    if name == "total" and broken["yes"]:
        raise ValueError("the bug")
    return name


@durable.workflow("tests.export.order")
def order(ctx):
    ctx.step("charge", do, ctx.run_id, "charge")
    approved = ctx.wait_for_signal("approved")
    ctx.step("total", do, ctx.run_id, "total", retry=durable.RetryPolicy(max_attempts=1))
    return approved


def test_an_exported_run_replays_in_a_test_against_fixed_code(tmp_path):
    broken["yes"] = True
    run = durable.start(order)
    drain()
    durable.signal(run.pk, "approved", {"by": "ann"})
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "failed"  # "production": the bug
    path = tmp_path / "run.json"
    out = io.StringIO()
    call_command("durable", "export", str(run.pk), "--output", str(path), stdout=out)
    exported = json.loads(path.read_text())
    assert exported["format"] == "django-durable-run/1"
    assert [e["key"] for e in exported["journal"]] == ["charge", "signal:approved:0", "total"]

    # A fresh database, as in the test suite of the project: load it, fix the code, retry.
    for model in (WorkItem, SignalMessage, Step, WorkflowRun):
        model.objects.all().delete()
    loaded = load_run(str(path))
    assert loaded.pk == run.pk and loaded.status == "failed"
    assert Step.objects.filter(run=loaded).count() == 3
    assert not WorkItem.objects.filter(run=loaded).exists()  # ended: no advance item until the retry makes one
    broken["yes"] = False
    durable.retry_run(loaded.pk)
    drain()
    loaded = WorkflowRun.objects.get(pk=run.pk)
    assert loaded.status == "completed" and loaded.get_result() == {"by": "ann"}
    assert ledger_counts(run.pk)["charge"] == 1  # replayed from the journal, not charged again


def test_an_unfinished_run_carries_on_after_loading():
    broken["yes"] = False
    run = durable.start(order)
    drain()  # charged, waiting for approval
    from django_durable.export import export_run

    data = export_run(run.pk)
    WorkflowRun.objects.filter(pk=run.pk).delete()
    loaded = load_run(data, run_id="00000000-0000-4000-8000-000000000001")
    assert loaded.status == "waiting"
    durable.signal(loaded.pk, "approved", "yes")
    drain()
    assert WorkflowRun.objects.get(pk=loaded.pk).get_result() == "yes"


def test_other_files_are_refused():
    with pytest.raises(ValueError, match="Not an exported run"):
        load_run({"format": "something else"})
