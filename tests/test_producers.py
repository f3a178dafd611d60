"""Many producers (RELIABILITY T45): a start wakes idle workers only when its queue has no ready
item waiting, so producers do not queue behind each other's NOTIFY at commit (bench/producers.py
measures it; a worker that runs out of work looks once more 50 ms later, for a start that saw the
item it was taking)."""

from __future__ import annotations

import pytest
from django.db import connection

import django_durable as durable
from django_durable.workpool import NOTIFY_CHANNEL

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _listener():
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    listener = psycopg.connect(**params, autocommit=True)
    listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
    return listener


def _heard(listener) -> int:
    return sum(1 for _ in listener.notifies(timeout=0.3))


def test_a_start_notifies_only_when_its_queue_has_no_ready_item_waiting():
    listener = _listener()
    try:
        durable.start("tests.three_steps", x=1)  # nothing waiting: an idle worker is told
        assert _heard(listener) == 1
        durable.start("tests.three_steps", x=2)  # the first still waits: the workers are busy
        durable.start("tests.three_steps", x=3)
        assert _heard(listener) == 0
        durable.start("tests.three_steps", x=4, queue="emails")  # another queue, nothing waiting there
        assert _heard(listener) == 1
    finally:
        listener.close()

