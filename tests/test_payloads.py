"""Large payloads stored apart (DURABLE_PAYLOAD_OFFLOAD_BYTES, STORAGES["durable"]): inputs, step
and run results and signal payloads above the limit go to the storage, come back when the workflow
needs them, show as a link in the admin and the API, and go with their run when it is pruned."""

import datetime as dt
import json
from pathlib import Path

import pytest
from django.core import checks
from django.utils import timezone
from rest_framework.test import APIClient

import django_durable as durable
from django_durable import payloads, retention
from django_durable.models import SignalMessage, Step, StoredPayload, WorkflowRun
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)
LIMIT = 2000


@pytest.fixture
def stored(settings, tmp_path) -> Path:
    settings.DURABLE_PAYLOAD_OFFLOAD_BYTES = LIMIT
    settings.STORAGES = {**settings.STORAGES, "durable": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": str(tmp_path), "base_url": "/durable-payloads/"}}}
    from django.core.files.storage import storages

    storages._storages.pop("durable", None)  # made anew from the changed setting
    storages.backends  # noqa: B018 - reads STORAGES again
    return tmp_path


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.json"))


def test_big_values_are_stored_apart_and_come_back(stored):
    data = [f"item {i}" * 20 for i in range(200)]
    run = durable.start("tests.big_payloads", data=data, wait_for_signal=True)
    drain()
    durable.signal(run.pk, "more", list(range(1000)))
    drain()
    run.refresh_from_db()
    assert run.status == "completed", run.error
    result = run.get_result()
    assert (result["lines"], result["input"], result["signal"]) == (50, 200, 1000)
    assert result["echo"][7] == "line 00000007 " + "x" * 100
    texts = {"input": run.input, "result": run.result, "step": Step.objects.get(run=run, key="big").result,
             "signal": SignalMessage.objects.get(run=run).payload}
    for where, text in texts.items():
        assert text.startswith(payloads.PREFIX) and len(text) < 200, (where, text[:100])
    assert len(files(stored)) == 4 == StoredPayload.objects.filter(run_id=run.pk).count()
    step_file = stored / payloads.reference(texts["step"])["name"]
    assert json.loads(step_file.read_text())[49].startswith("line 00000049")


def test_a_large_input_is_stored_apart_however_the_run_starts(stored):
    """start(), start_many() and a schedule's fire time encode a run's input the same way."""
    from django_durable import schedules

    data = [f"item {i}" * 20 for i in range(200)]
    one = durable.start("tests.big_payloads", data=data)
    many = durable.start_many("tests.big_payloads", [{"data": data}, {"data": ["small"]}])
    schedules.ensure_schedule("big-input", "tests.big_payloads", interval=3600, kwargs={"data": data})
    fire_time = timezone.now().replace(microsecond=0)
    schedules._start_runs([(schedules.get("big-input"), fire_time)], "default")
    fired = WorkflowRun.objects.get(idempotency_key__startswith="schedule:big-input:")
    inputs = [WorkflowRun.objects.get(pk=pk).input for pk in (one.pk, *many, fired.pk)]
    assert [text.startswith(payloads.PREFIX) for text in inputs] == [True, True, False, True], [t[:60] for t in inputs]
    assert StoredPayload.objects.filter(run_id__in=[one.pk, many[0], fired.pk]).count() == 3
    drain()
    for pk in (one.pk, many[0], fired.pk):
        run = WorkflowRun.objects.get(pk=pk)
        assert run.status == "completed" and run.get_result()["input"] == 200, run.error


def test_start_many_refusing_one_call_stores_no_input_of_another(stored):
    data = [f"item {i}" * 20 for i in range(200)]
    with pytest.raises(durable.InvalidArguments if hasattr(durable, "InvalidArguments") else TypeError,
                       match=r"calls\[1\]"):
        durable.start_many("tests.big_payloads", [{"data": data}, {"nonsense": 1}])
    assert files(stored) == [] and not StoredPayload.objects.exists()


def test_small_values_stay_in_the_tables(stored):
    run = durable.start("tests.big_payloads")
    drain()
    run.refresh_from_db()
    assert run.status == "completed"
    assert not run.input.startswith(payloads.PREFIX) and not run.result.startswith(payloads.PREFIX)
    assert Step.objects.get(run=run, key="big").result.startswith(payloads.PREFIX)  # 50 lines: over the limit
    assert len(files(stored)) == 1


def test_the_admin_and_the_api_show_a_link_not_the_body(stored, admin_client, admin_user):
    run = durable.start("tests.big_payloads", wait_for_signal=True)
    drain()
    durable.signal(run.pk, "more", [])
    drain()
    page = admin_client.get(f"/admin/django_durable/workflowrun/{run.pk}/change/").content.decode()
    name = payloads.reference(WorkflowRun.objects.get(pk=run.pk).result)["name"]
    assert f'<a href="/durable-payloads/{name}">{name}</a>' in page and "Stored apart" in page
    step = payloads.reference(Step.objects.get(run=run, key="big").result)["name"]
    assert f'<a href="/durable-payloads/{step}">{step}</a>' in page  # the step's result in the journal too
    assert "line 00000049" not in page
    api = APIClient()
    api.force_authenticate(admin_user)
    shown = api.get(f"/api/durable/workflows/{run.pk}/").json()["result"]
    assert shown == {"stored": {"bytes": (stored / name).stat().st_size, "name": name,
                                "url": f"/durable-payloads/{name}"}}


def test_the_prune_deletes_the_stored_files_with_their_runs(stored, settings):
    settings.DURABLE_RETENTION = dt.timedelta(days=7)
    old, recent = durable.start("tests.big_payloads"), durable.start("tests.big_payloads")
    drain()
    WorkflowRun.objects.filter(pk=old.pk).update(finished_at=timezone.now() - dt.timedelta(days=8))
    assert len(files(stored)) == 2
    assert retention.prune() == (1, 0)
    assert [p.parent.name for p in files(stored)] == [str(recent.pk)]
    assert list(StoredPayload.objects.values_list("run_id", flat=True)) == [recent.pk]


def test_offloading_needs_a_durable_storage(settings):
    settings.DURABLE_PAYLOAD_OFFLOAD_BYTES = LIMIT
    settings.STORAGES = {name: options for name, options in settings.STORAGES.items() if name != "durable"}
    shapes = {"django_durable.E011", "django_durable.W004", "django_durable.W005"}  # workflows other test modules register on purpose
    assert [e.id for e in checks.run_checks() if e.id.startswith("django_durable") and e.id not in shapes] == \
        ["django_durable.E009"]
    settings.DURABLE_PAYLOAD_OFFLOAD_BYTES = "1 MB"
    assert "positive number of bytes" in [e.msg for e in checks.run_checks() if e.id == "django_durable.E009"][0]


def test_a_prune_with_nothing_stored_apart_needs_no_durable_storage(settings):
    # A project that never stores payloads apart has no STORAGES["durable"]; dropping a partition
    # of runs deletes their (no) stored files, which must not ask for it (it did, on 2026-11-25).
    from django.core.files.storage import storages

    settings.STORAGES = {name: options for name, options in settings.STORAGES.items() if name != "durable"}
    storages._storages.pop("durable", None)
    assert payloads.delete_files([]) == 0 and payloads.delete([]) == 0
    with pytest.raises(Exception, match="durable"):
        payloads.delete_files(["gone.json"])  # with a file to delete, the missing storage is an error


def test_a_stored_value_is_returned_as_a_replay_will_return_it(stored):
    from decimal import Decimal

    from django_durable import serialization
    from django_durable.models import uuid7

    value = (Decimal("1.50"), {"at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "n": 3}, ["x" * LIMIT])
    text = serialization.encode(value, owner=uuid7())
    assert text.startswith(payloads.PREFIX)
    first, replayed = serialization.replayed(value, text), serialization.decode(text)
    assert first == replayed == [Decimal("1.50"), {"at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "n": 3},
                                 ["x" * LIMIT]]
