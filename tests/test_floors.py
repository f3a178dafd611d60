"""A claimer starts its next claim where its last one left off (workpool.claiming.Floors): the
entries a held snapshot keeps in the ready index are passed over inside the index. What comes in
before the floor is still claimed: a higher priority at once, anything else as soon as the floor
finds nothing, and at the latest FLOOR_SECONDS later. Both backends keep the same contract."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from django.db import connection, transaction
from django.db.models import TextField
from django.db.models.functions import Cast
from django.test import override_settings

import django_durable as durable
from django_durable import workpool
from django_durable.models import WorkItem
from django_durable.workpool import backend, claiming
from django_durable.workpool.claiming import FLOOR_SECONDS, floors
from django_durable.workpool.rows import ClaimParams, Place

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def items_of(run_ids) -> list[WorkItem]:
    """The runs' items in the claim order."""
    return list(WorkItem.objects.filter(run_id__in=run_ids).order_by("-priority", "available_at", "id"))


def place(item: WorkItem) -> Place:
    """The item's place in the claim order, as its backend's claims answer it."""
    if connection.vendor == "sqlite":
        stored = WorkItem.objects.filter(pk=item.pk).values_list(Cast("available_at", TextField()), flat=True).get()
        return Place(item.priority, stored, item.id)
    return Place(item.priority, item.available_at, item.id)


def params(floor: Place | None) -> ClaimParams:
    return ClaimParams("w-floor", None, "default", uuid.uuid4(), 30.0, floor=floor)


def claim():
    return workpool.claim(worker="w-floor", queues=None, db="default")


@pytest.fixture
def frozen(monkeypatch):
    """The floors' clock, moved by the test."""
    now = [1000.0]
    monkeypatch.setattr(floors, "clock", lambda: now[0])
    return now


def test_a_claim_from_a_floor_takes_only_what_comes_after_it():
    """The backend's contract: a higher priority, or the floor's priority at or after it."""
    a, b, c, d = items_of(durable.start_many("tests.echo", [[n] for n in range(4)]))
    pool = backend.of("default")
    taken = pool.claim(params(place(b)))
    assert (taken.item_id, taken.place.id) == (b.id, b.id)  # a is before the floor: left
    [high] = items_of([durable.start("tests.echo", 9, priority=5).pk])
    assert pool.claim(params(place(c))).item_id == high.id  # above the floor's priority: first
    if pool.batches("default", None):  # PostgreSQL on plain tables: one statement
        assert [row.item_id for row, _ in pool.claim_many(params(place(c)), [uuid.uuid4() for _ in range(5)])] \
            == [c.id, d.id]
    else:
        assert pool.claim(params(place(c))).item_id == c.id
        assert pool.claim(params(place(c))).item_id == d.id
    assert pool.claim(params(place(c))) is None  # a, before the floor, is all that is left
    assert pool.claim(params(None)).item_id == a.id


def earlier_than(item: WorkItem) -> WorkItem:
    """An item that came in behind `item` (its transaction began before `item` was ready and
    committed after it was claimed): before it in the claim order."""
    [late] = items_of([durable.start("tests.echo", "late").pk])
    WorkItem.objects.filter(pk=late.pk).update(available_at=item.available_at - dt.timedelta(seconds=1))
    late.refresh_from_db()
    return late


def test_a_claimer_starts_at_its_floor_and_looks_from_the_start_when_it_must(frozen):
    first, second, third = items_of(durable.start_many("tests.echo", [[n] for n in range(3)]))
    assert claim().item_id == first.id
    assert floors.of("default", None) == place(first)
    late = earlier_than(first)
    assert claim().item_id == second.id  # from the floor, which the late one is before
    assert claim().item_id == third.id
    assert claim().item_id == late.id  # the floor found nothing: from the start at once
    assert claim() is None

    # A claimer that keeps finding work from its floor looks from the start after FLOOR_SECONDS.
    more = items_of(durable.start_many("tests.echo", [[n] for n in range(3)]))
    assert claim().item_id == more[0].id
    missed = earlier_than(more[0])
    assert claim().item_id == more[1].id
    frozen[0] += FLOOR_SECONDS
    assert claim().item_id == missed.id
    assert claim().item_id == more[2].id

    # Nothing is ready from the start either: the floor stays where it was, looked past as of now.
    assert claim() is None
    assert floors.of("default", None).id == more[2].id


def test_a_batch_that_takes_fewer_than_it_asked_for_sets_its_floor_at_the_last(frozen):
    items = items_of(durable.start_many("tests.echo", [[n] for n in range(3)]))
    claims = workpool.claim_many(worker="w-floor", queues=None, db="default", k=5)
    assert [c.item_id for c in claims] == [item.id for item in items]
    assert floors.of("default", None).id == items[-1].id


def test_a_higher_priority_is_claimed_at_once_from_a_floor(frozen):
    low = items_of(durable.start_many("tests.echo", [[n] for n in range(3)]))
    assert claim().item_id == low[0].id
    [high] = items_of([durable.start("tests.echo", "urgent", priority=10).pk])
    assert claim().item_id == high.id
    assert [claim().item_id, claim().item_id] == [low[1].id, low[2].id]


@pytest.mark.parametrize("queues, setting", [
    (None, {"reports": {"fairness": True}}),
    (["default"], {"default": {"concurrency": 5}}),
    (["default", "emails"], {}),
])
def test_claims_of_several_queues_or_of_limited_or_fair_ones_always_look_from_the_start(queues, setting):
    """Their items may be held back by a limit, or ready again at an earlier turn: a floor would
    pass them over."""
    durable.start_many("tests.echo", [[n] for n in range(3)])
    with override_settings(DURABLE_QUEUES=setting):
        assert workpool.claim(worker="w-floor", queues=queues, db="default") is not None
        assert floors.of("default", queues) is None


def _buffers(sql: str, values: list) -> int:
    """The shared buffers a pick reads (EXPLAIN ANALYZE runs it: its locks are rolled back)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, values)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = plan[0] if isinstance(plan, list) else plan
    return plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]


@pytest.mark.postgres
def test_a_claim_from_its_floor_passes_over_what_a_held_snapshot_keeps(frozen):
    """A REPEATABLE READ session holds a snapshot while 2,400 items are claimed: each leaves its
    pending version's entry in the ready index, which VACUUM may not remove and no scan may mark
    dead. A claim from the start of the index visits every one of them; from the floor, a few pages."""
    import psycopg

    from django_durable.workpool import postgres

    durable.start_many("tests.echo", [[n] for n in range(3000)])
    settings = connection.settings_dict
    held = psycopg.connect(dbname=settings["NAME"], user=settings["USER"], password=settings["PASSWORD"] or None,
                           host=settings["HOST"] or None, port=settings["PORT"] or None)
    try:
        held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        held.execute("SELECT count(*) FROM durable_work_item").fetchone()
        for _ in range(2400):
            assert claim() is not None
        floor = floors.of("default", None)
        assert floor is not None
        from_start = _buffers(*postgres._pick(None, "default"))
        from_floor = _buffers(*postgres._pick(None, "default", floor=floor))
        assert from_floor <= 12, (from_floor, from_start)
        assert from_start >= 5 * from_floor, (from_floor, from_start)
        # The floor's answer is the start's: the next item in the claim order.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(*postgres._pick(None, "default"))
            first = cursor.fetchone()
            transaction.set_rollback(True)
        assert claiming.claim(worker="w-floor", queues=None, db="default").item_id == first[0]
    finally:
        held.close()
