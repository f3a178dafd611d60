"""Streams out of a run (ctx.write_stream(), durable.read_stream()) and its live events, server-sent
(GET /api/durable/workflows/{id}/stream/)."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Permission
from django.db import connections
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import Step
from django_durable.testing import drain

pytestmark = pytest.mark.django_db


def frames(response) -> list[tuple[str | None, str, str]]:
    """(id, event, data) of each server-sent event of a finished stream."""
    text = b"".join(response.streaming_content).decode()
    found = []
    for block in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(":"))
        if "event" in fields:
            found.append((fields.get("id"), fields["event"], fields["data"]))
    return found


def test_a_stream_is_written_once_and_read_in_order():
    run = durable.start("tests.streamer", n=4)
    drain()
    assert list(durable.read_stream(run.pk, "tokens")) == ["t0", "t1", "t2", "t3"]
    entries = Step.objects.filter(run=run, kind="stream").order_by("seq")
    assert [e.key for e in entries] == ["stream:tokens:0", "stream:tokens:1", "stream:tokens:2", "stream:tokens:3",
                                        "stream:tokens:4"]  # the last: its close
    assert list(durable.read_stream(run.pk, "other")) == []  # the run ended: nothing more will come
    with pytest.raises(durable.WorkflowNotFound):
        list(durable.read_stream("01900000-0000-7000-8000-000000000000", "tokens"))


def test_the_live_events_of_a_run_and_a_resume_after_an_id(admin_user):
    run = durable.start("tests.streamer", n=2)
    drain()
    client = APIClient()
    client.force_authenticate(admin_user)
    response = client.get(f"/api/durable/workflows/{run.pk}/stream/", HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    seen = frames(response)
    kinds = [event for _, event, _ in seen]
    assert kinds == ["step", "stream", "stream", "note", "stream", "status", "end"], seen
    assert '"key":"prepare"' in seen[0][2] and '"status":"completed"' in seen[0][2]
    assert '"value":"t0"' in seen[1][2] and '"closed":true' in seen[4][2]
    assert seen[-1][2] == '{"status":"completed","result":2}'
    resumed = frames(client.get(f"/api/durable/workflows/{run.pk}/stream/", HTTP_ACCEPT="text/event-stream",
                                HTTP_LAST_EVENT_ID=seen[2][0]))
    assert [event for _, event, _ in resumed] == ["note", "stream", "status", "end"]


def test_the_stream_route_has_the_detail_routes_permissions(django_user_model):
    run = durable.start("tests.streamer", n=1)
    drain()
    url = f"/api/durable/workflows/{run.pk}/stream/"
    assert APIClient().get(url, HTTP_ACCEPT="text/event-stream").status_code in (401, 403)
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    client = APIClient()
    client.force_authenticate(viewer)
    seen = frames(client.get(url, HTTP_ACCEPT="text/event-stream"))
    stream = next(data for _, event, data in seen if event == "stream")
    assert '"value"' not in stream  # no payload permission: the value is not shown
    assert seen[-1] == (None, "end", '{"status":"completed"}')
    assert client.get(f"/api/durable/workflows/{run.pk}/stream/?after=x").status_code == 400
    assert client.get("/api/durable/workflows/01900000-0000-7000-8000-000000000000/stream/").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_a_reader_gets_each_value_while_a_worker_process_writes_them(start_worker):
    run = durable.start("tests.streamer", n=3, gap=1.0)
    got = []

    def read():
        from django_durable.models import WorkflowRun

        try:
            for value in durable.read_stream(run.pk, "tokens", timeout=60):
                got.append((value, WorkflowRun.objects.get(pk=run.pk).status))
        finally:
            connections.close_all()

    reader = threading.Thread(target=read)
    reader.start()
    start_worker(burst=False)
    reader.join(timeout=90)
    assert [value for value, _ in got] == ["t0", "t1", "t2"]
    # The first came while the run went on (two durable sleeps of a second lay ahead of it), not
    # all at its end.
    assert got[0][1] != "completed", got


@pytest.mark.django_db(transaction=True)
def test_under_asgi_the_events_are_an_async_iterator_that_waits_for_the_run(admin_user, settings):
    import asyncio

    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    from django_durable.services import updates

    settings.DURABLE_STREAM_MAX_SECONDS = 30
    run = durable.start("tests.cart")
    drain()  # waiting for an update

    def finish():
        try:
            updates.send(run.pk, "add", "checkout")
            drain()
        finally:
            connections.close_all()  # (a thread of the executor's)

    async def main():
        client = AsyncClient()
        await client.aforce_login(admin_user)
        response = await client.get(f"/api/durable/workflows/{run.pk}/stream/", headers={"accept": "text/event-stream"})
        assert response.status_code == 200 and response.is_async
        seen = []
        async for chunk in response.streaming_content:
            seen.append(chunk.decode())
            if '"status":"waiting"' in seen[-1]:
                await sync_to_async(finish, thread_sensitive=False)()  # the run ends while the stream waits
        return "".join(seen)

    text = asyncio.run(asyncio.wait_for(main(), timeout=60))
    assert '"status":"waiting"' in text and "event: end" in text and '"status":"completed"' in text
