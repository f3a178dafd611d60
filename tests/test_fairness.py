"""Fair shares within a queue (DURABLE_QUEUES[...]["fairness"]): a key's backlog does not keep
another key's items behind it, weights give a key more turns, a started run keeps its turn, and
the turns are exact under concurrent producers."""

from __future__ import annotations

import collections
import json

import pytest
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

import django_durable as durable
from django_durable import workpool
from django_durable.models import FairTurn, WorkflowRun, WorkItem
from django_durable.stats import queue_lag
from django_durable.testing import drain
from django_durable.workpool import fairness
from tests.conftest import assert_settled
from tests.harness.workers import in_threads
from tests.testapp import ledger

pytestmark = pytest.mark.django_db(transaction=True)

FAIR = {"reports": {"fairness": True}}
WEIGHTED = {"reports": {"fairness": {"weights": {"heavy": 3}}}}


def backlog(key: str, count: int, **input) -> list:
    """`count` runs of tests.marked in the reports queue with `key`, started at once (start_many)."""
    return durable.start_many("tests.marked", [{"label": key, **input}] * count, queue="reports",
                              concurrency_key=key)


def claimed_keys(count: int) -> list[str]:
    """The keys of the next `count` items claimed from the reports queue, one claim at a time."""
    keys = []
    for _ in range(count):
        claim = workpool.claim(worker="w-fair", queues=["reports"], db="default")
        assert claim is not None
        keys.append(WorkItem.objects.get(pk=claim.item_id).concurrency_key)
    return keys


@pytest.mark.parametrize("fair", [True, False])
def test_a_keys_backlog_does_not_keep_a_later_key_waiting(fair):
    with override_settings(DURABLE_QUEUES=FAIR if fair else {}):
        backlog("heavy", 200)
        for _ in range(5):
            durable.start("tests.marked", label="light", queue="reports", concurrency_key="light")
        keys = claimed_keys(12)
    if fair:
        # The light key starts at the queue's head: its items alternate with the backlog's next.
        assert keys == ["heavy", "light"] * 5 + ["heavy", "heavy"]
    else:
        assert keys == ["heavy"] * 12  # first come, first served: the light key waits for all 200


def test_a_weight_gives_a_key_that_many_turns_to_one():
    with override_settings(DURABLE_QUEUES=WEIGHTED):
        backlog("heavy", 60)
        backlog("light", 60)
        keys = claimed_keys(40)
    assert collections.Counter(keys) == {"heavy": 30, "light": 10}
    assert keys[:8] == ["heavy", "heavy", "heavy", "light"] * 2


def test_a_weighted_key_gives_each_turn_to_that_many_items_started_one_by_one_or_at_once():
    with override_settings(DURABLE_QUEUES=WEIGHTED):
        single = [durable.start("tests.marked", queue="reports", concurrency_key="heavy").pk for _ in range(4)]
        many = backlog("heavy", 5)
        light = backlog("light", 2)
    turns = dict(WorkItem.objects.values_list("run_id", "turn"))
    first = turns[single[0]]
    assert [(turns[run] - first) // fairness.TICK for run in [*single, *many]] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [(turns[run] - first) // fairness.TICK for run in light] == [0, 1]  # from the queue's head, one a turn
    assert WorkItem.objects.filter(run_id__in=[*single, *many, *light]).exclude(available_at=F("turn")).count() == 0


def test_a_key_that_fell_behind_starts_again_at_the_head_and_an_unfair_queue_takes_no_turns():
    with override_settings(DURABLE_QUEUES=FAIR):
        first = durable.start("tests.marked", queue="reports", concurrency_key="a")
        row = FairTurn.objects.get(queue="reports", key="a")
        item = WorkItem.objects.get(run_id=first.pk)
        assert item.turn == item.available_at == row.turn and row.used == 1  # the last turn given, and to how many
        drain(queues=["reports"])
        later = durable.start("tests.marked", queue="reports", concurrency_key="a")  # idle meanwhile
        assert WorkItem.objects.get(run_id=later.pk).turn > row.turn
        other = durable.start("tests.marked", queue="default", concurrency_key="a")
        shown = {row["queue"]: row["limits"] for row in queue_lag(timezone.now())}
    assert shown == {"default": "", "reports": "fair shares by key"}  # the overview and `durable stats`
    assert WorkItem.objects.get(run_id=other.pk).turn is None
    assert FairTurn.objects.count() == 1
    assert fairness.turns("default", "default", "a") is None


def test_a_started_run_keeps_its_turn_when_woken_and_its_branches_take_it():
    """A run that waits for a signal, and a fan-out, in a fair queue behind another key's backlog
    queued after they started: woken, and their branches, they go first (without their turn, each
    would wait for the whole backlog)."""
    with override_settings(DURABLE_QUEUES=FAIR):
        waiting = durable.start("tests.two_signals", queue="reports", concurrency_key="light")
        fan = durable.start("tests.squares", n=4, queue="reports", concurrency_key="light")
        assert drain(queues=["reports"], max_items=2) == 2  # each started: one waits, one queued branches
        backlog("heavy", 50)
        durable.signal(waiting.pk, "go", 1)
        drain(queues=["reports"], max_items=7)  # the woken run, the 4 branches, the fan-out's end, 1 spare
        assert WorkflowRun.objects.get(pk=fan.pk).status == "completed"
        assert WorkflowRun.objects.get(pk=waiting.pk).waiting_on == "signal 'go'"
        assert sum(1 for _, label, _ in ledger.entries() if label == "heavy") <= 1
        assert WorkflowRun.objects.filter(concurrency_key="heavy", status="completed").count() <= 1


@pytest.mark.postgres
def test_a_batch_claim_takes_the_keys_in_turns():
    with override_settings(DURABLE_QUEUES=FAIR):
        backlog("heavy", 200)
        backlog("light", 10)
        claims = workpool.claim_many(worker="w-batch", queues=["reports"], db="default", k=20)
    keys = dict(WorkItem.objects.filter(pk__in=[c.item_id for c in claims]).values_list("pk", "concurrency_key"))
    assert [keys[c.item_id] for c in claims] == ["heavy", "light"] * 10


@pytest.mark.postgres
def test_concurrent_producers_of_one_key_take_a_turn_each():
    """12 threads starting runs of one key at once: 120 items, 120 turns (the key's row lock)."""
    with override_settings(DURABLE_QUEUES=FAIR):
        def produce(index):
            for _ in range(10):
                durable.start("tests.marked", queue="reports", concurrency_key="shared")

        assert in_threads(produce, 12) == []
    turns = list(WorkItem.objects.filter(queue="reports").values_list("turn", flat=True))
    assert len(turns) == 120 and len(set(turns)) == 120


def test_a_worker_process_serves_a_later_key_between_a_backlogs_items(start_worker):
    """A real worker (batches on PostgreSQL): 300 runs of one key queued, then 10 of another;
    the 10 run among the first claims, and everything runs once."""
    with override_settings(DURABLE_QUEUES=FAIR):
        heavy = backlog("heavy", 300)
        light = [durable.start("tests.marked", label="light", queue="reports", concurrency_key="light").pk
                 for _ in range(10)]
    worker = start_worker("--queue", "reports", env={"DURABLE_TEST_QUEUES": json.dumps(FAIR)})
    assert worker.wait(timeout=240) == 0, worker.log()
    order = [label for _, label, _ in ledger.entries()]
    assert len(order) == 310 and collections.Counter(order) == {"heavy": 300, "light": 10}
    # One claim cycle: a batch of up to DURABLE_CLAIM_BATCH (64) claims; the 10 are among the first 20.
    assert max(i for i, label in enumerate(order) if label == "light") < 64 + 20, order[:100]
    assert WorkflowRun.objects.filter(pk__in=[*heavy, *light], status="completed").count() == 310
    assert_settled()
