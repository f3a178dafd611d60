"""Durable sleep, signals, events and cancellation, in-process with the test clock."""

import datetime as dt

import pytest

import django_durable as durable
from django_durable import ids, signals
from django_durable.models import SignalMessage, Step, Timer, WorkflowRun, WorkItem
from django_durable.testing import clock, drain
from tests.conftest import ledger_counts

pytestmark = pytest.mark.django_db(transaction=True)


def run_of(run):
    return WorkflowRun.objects.get(pk=run.pk)


# -- sleep --------------------------------------------------------------------------------------


def test_a_one_day_sleep_waits_for_the_clock_and_holds_no_worker():
    with clock() as test_clock:
        start = test_clock.now
        run = durable.start("tests.sleeper", dt.timedelta(days=1))
        drain()
        run = run_of(run)
        assert run.status == "waiting"
        assert run.waiting_on == f"sleep 'nap' until {start + dt.timedelta(days=1):%Y-%m-%d %H:%M:%S} UTC"
        assert WorkItem.objects.get(run=run).status == "completed"  # idle: no claim, no lease
        assert Step.objects.get(run=run, key="nap").deadline_at == start + dt.timedelta(days=1)

        test_clock.advance(hours=23, minutes=59)
        assert drain() == 0
        assert run_of(run).status == "waiting"
        test_clock.advance(minutes=1)
        assert drain() == 1
    run = run_of(run)
    assert run.status == "completed" and run.get_result() == ["before", "after"]
    assert ledger_counts(run.pk) == {"before": 1, "after": 1}
    assert Timer.objects.get(run=run).status == "fired"
    nap = Step.objects.get(run=run, key="nap")  # the entry keeps when the wait began
    assert (nap.started_at, nap.finished_at) == (start, start + dt.timedelta(days=1))


@durable.workflow("tests.waits.sleep_twice")
def sleep_twice(ctx):
    ctx.sleep("short", 0)  # returns at once
    ctx.sleep_until("until", ctx.now() + dt.timedelta(hours=1))
    return "awake"


def test_sleep_until_and_a_zero_sleep():
    with clock() as test_clock:
        run = durable.start(sleep_twice)
        drain()
        assert run_of(run).status == "waiting"
        test_clock.advance(hours=1)
        drain()
    assert run_of(run).get_result() == "awake"


def test_sleep_until_needs_an_aware_datetime():
    @durable.workflow("tests.waits.naive")
    def naive(ctx):
        ctx.sleep_until("x", dt.datetime(2030, 1, 1))

    run = durable.start(naive)
    drain()
    assert "sleep_until needs an aware datetime" in run_of(run).get_error()["message"]


# -- signals ------------------------------------------------------------------------------------


def test_signals_sent_before_the_wait_are_consumed_in_order_one_per_wait():
    run = durable.start("tests.two_signals")
    first = durable.signal(run.pk, "go", {"n": 1})
    durable.signal(run.pk, "go", {"n": 2})
    drain()
    run = run_of(run)
    assert run.get_result() == [{"n": 1}, {"n": 2}]
    consumed = dict(SignalMessage.objects.filter(run=run).values_list("id", "consumed_by"))
    assert consumed[first.pk] == "signal:go:0"
    assert sorted(consumed.values()) == ["signal:go:0", "signal:go:1"]


def test_a_run_waits_for_a_signal_then_resumes():
    run = durable.start("tests.two_signals")
    drain()
    run = run_of(run)
    assert (run.status, run.waiting_on) == ("waiting", "signal 'go'")
    durable.signal(run.pk, "go", "one")
    drain()
    assert run_of(run).waiting_on == "signal 'go'"
    durable.signal(run.pk, "go", "two")
    drain()
    assert run_of(run).get_result() == ["one", "two"]
    assert ledger_counts(run.pk) == {"between": 1}


def test_wait_for_signal_with_a_timeout_both_ways():
    with clock() as test_clock:
        late = durable.start("tests.approval", timeout=60)
        early = durable.start("tests.approval", timeout=60)
        drain()
        durable.signal(early.pk, "approved", {"by": "alice"})
        drain()
        test_clock.advance(seconds=60)
        drain()
    assert run_of(early).get_result() == {"by": "alice"}
    assert run_of(late).get_result() == "timed out"
    assert Step.objects.get(run=late, key="signal:approved:0").status == "failed"
    assert Timer.objects.get(run=early, kind="signal_timeout").status == "cancelled"


# -- first come wins, by the database's clock -----------------------------------------------------------


def test_a_signal_stored_after_the_timeout_loses_even_if_no_worker_looked_in_between():
    with clock() as test_clock:
        run = durable.start("tests.approval_twice", 60)
        drain()
        test_clock.advance(seconds=61)  # the deadline passes while no worker runs...
        late = durable.signal(run.pk, "approved", "late")  # ...then the signal arrives
        drain()
        # The first wait timed out; the late signal was left for the second wait.
        assert run_of(run).status == "completed"
        assert run_of(run).get_result() == ["timed out", "late"]
        assert SignalMessage.objects.get(pk=late.pk).consumed_by == "signal:approved:1"


def test_a_signal_stored_before_the_timeout_wins_even_if_the_worker_is_late():
    with clock() as test_clock:
        run = durable.start("tests.approval", timeout=60)
        drain()
        test_clock.advance(seconds=30)
        durable.signal(run.pk, "approved", "in time")
        test_clock.advance(seconds=31)  # the worker looks only after the deadline
        drain()
        assert run_of(run).get_result() == "in time"


def test_an_event_after_the_timeout_is_not_delivered_and_the_wait_times_out():
    with clock() as test_clock:
        late = durable.start("tests.payment_waiter", order_id=1, timeout=60)
        on_time = durable.start("tests.payment_waiter", order_id=2, timeout=120)
        drain()
        test_clock.advance(seconds=61)
        assert durable.emit_event("payment.settled", {"order": {"id": 1}, "amount": 5}) == 0
        assert durable.emit_event("payment.settled", {"order": {"id": 2}, "amount": 7}) == 1
        test_clock.advance(seconds=120)  # both deadlines passed before a worker looked
        drain()
        assert run_of(late).get_result() == "no payment"
        assert run_of(on_time).get_result() == 7


def test_waits_in_a_fan_out_of_children_each_follow_their_own_order_of_arrival():
    with clock() as test_clock:
        run = durable.start("tests.fan_out_waits", 3, 60)
        drain()
        children = [WorkflowRun.objects.get(parent_id=run.pk, pk=ids.child_id(run.pk, f"w{i}"))
                    for i in range(3)]
        durable.signal(children[0].pk, "approved", "first")
        test_clock.advance(seconds=61)
        durable.signal(children[1].pk, "approved", "too late")
        drain()
        assert run_of(run).get_result() == ["first", "timed out", "timed out"]
        assert SignalMessage.objects.get(run_id=children[1].pk).consumed_at is None  # never taken


def test_signals_to_unknown_finished_and_cancelled_runs_are_refused_and_not_stored():
    with pytest.raises(durable.WorkflowNotFound):
        durable.signal("8b4e4a3c-0000-4000-8000-000000000000", "go")
    with pytest.raises(durable.WorkflowNotFound):
        durable.signal("not-a-uuid", "go")
    done = durable.start("tests.three_steps", x=1)
    drain()
    with pytest.raises(durable.RunFinished, match="already ended completed"):
        durable.signal(done.pk, "go")
    cancelled = durable.start("tests.two_signals")
    durable.cancel(cancelled.pk)
    with pytest.raises(durable.RunFinished, match="cancelled"):
        durable.signal(cancelled.pk, "go")
    assert SignalMessage.objects.count() == 0


def test_a_duplicate_signal_with_one_idempotency_key_is_stored_once():
    run = durable.start("tests.two_signals")
    first = durable.signal(run.pk, "go", 1, idempotency_key="webhook-17")
    again = durable.signal(run.pk, "go", 1, idempotency_key="webhook-17")
    assert again.pk == first.pk
    assert SignalMessage.objects.count() == 1


@pytest.mark.parametrize("bad", ["", "x" * 201, None, 7])
def test_bad_signal_names_are_refused(bad):
    run = durable.start("tests.two_signals")
    with pytest.raises(ValueError, match="signal name"):
        durable.signal(run.pk, bad)


def test_a_signal_payload_must_be_json():
    run = durable.start("tests.two_signals")
    with pytest.raises(durable.NotSerializable, match=r"signal payload\['when'\] is of type builtins.set"):
        durable.signal(run.pk, "go", {"when": {1}})
    assert SignalMessage.objects.count() == 0


# -- events -------------------------------------------------------------------------------------


def test_an_event_wakes_exactly_the_waiting_runs_that_match():
    runs = {order: durable.start("tests.payment_waiter", order) for order in (1, 2, 3)}
    drain()
    assert run_of(runs[1]).waiting_on == "event 'payment.settled' matching {\"order.id\":1}"
    assert durable.emit_event("payment.settled", {"order": {"id": 2}, "amount": "9.99"}) == 1
    drain()
    assert run_of(runs[2]).get_result() == "9.99"
    assert run_of(runs[1]).status == run_of(runs[3]).status == "waiting"
    assert durable.emit_event("payment.settled", {"order": {"id": 99}, "amount": "1"}) == 0
    assert durable.emit_event("nobody.listens", {"order": {"id": 1}}) == 0
    drain()
    assert run_of(runs[1]).status == "waiting"


def test_without_event_retention_events_are_not_kept_for_runs_that_are_not_waiting_yet(settings):
    settings.DURABLE_EVENT_RETENTION = 0  # by default they are: tests/test_kept_events.py
    run = durable.start("tests.payment_waiter", 5, timeout=60)
    assert durable.emit_event("payment.settled", {"order": {"id": 5}, "amount": "5"}) == 0  # too early
    with clock() as test_clock:
        drain()
        assert run_of(run).status == "waiting"
        test_clock.advance(seconds=60)
        drain()
    assert run_of(run).get_result() == "no payment"


# -- cancellation ---------------------------------------------------------------------------------


def test_cancel_a_pending_run_never_starts_it():
    run = durable.start("tests.three_steps", x=1)
    cancelled = durable.cancel(run.pk, reason="customer asked")
    assert cancelled.status == "cancelled"
    assert drain() == 0
    run = run_of(run)
    assert run.get_error() == {"type": "django_durable.exceptions.Cancelled", "message": "customer asked",
                               "traceback": ""}
    assert ledger_counts(run.pk) == {}
    with pytest.raises(durable.WorkflowFailed, match="cancelled"):
        durable.wait(run.pk, timeout=1)


def test_cancel_a_sleeping_run_cancels_its_timer_and_it_never_wakes():
    events = []
    signals.run_cancelled.connect(lambda sender, **kw: events.append(kw["run_id"]), weak=False, dispatch_uid="t")
    try:
        with clock() as test_clock:
            run = durable.start("tests.sleeper", 60)
            drain()
            durable.cancel(run.pk)
            test_clock.advance(hours=1)
            assert drain() == 0
    finally:
        signals.run_cancelled.disconnect(dispatch_uid="t")
    assert run_of(run).status == "cancelled"
    assert Timer.objects.get(run=run).status == "cancelled"
    assert ledger_counts(run.pk) == {"before": 1}
    assert events == [run.pk]


def test_cancel_is_idempotent_and_finished_runs_stay_finished():
    run = durable.start("tests.two_signals")
    assert durable.cancel(run.pk).status == "cancelled"
    assert durable.cancel(run.pk).status == "cancelled"
    done = durable.start("tests.three_steps", x=1)
    drain()
    with pytest.raises(durable.RunFinished, match="completed"):
        durable.cancel(done.pk)
    assert run_of(done).status == "completed"
    with pytest.raises(durable.WorkflowNotFound):
        durable.cancel("nope")


def test_cancel_a_parent_cancels_its_unfinished_children():
    parent = durable.start("tests.two_signals")
    child = durable.start("tests.sleeper", 60)
    grandchild = durable.start("tests.two_signals")
    finished = durable.start("tests.three_steps", x=1)
    drain()
    WorkflowRun.objects.filter(pk__in=[child.pk, finished.pk]).update(parent=parent.pk)
    WorkflowRun.objects.filter(pk=grandchild.pk).update(parent=child.pk)
    durable.cancel(parent.pk, reason="stop")
    assert run_of(child).status == run_of(grandchild).status == "cancelled"
    assert f"parent run {parent.pk} was cancelled" in run_of(child).get_error()["message"]
    assert run_of(finished).status == "completed"


def test_a_cancel_requested_while_running_ends_the_run_at_its_next_checkpoint():
    run = durable.start("tests.three_steps", x=1)
    from django_durable import workpool
    from django_durable.engine.replay import advance

    claim = workpool.claim(worker="w", queues=None, db="default")
    durable.cancel(run.pk)  # the run is held by a worker: only requested
    run = run_of(run)
    assert run.status == "running" and run.cancel_requested_at is not None
    assert advance(claim) == "cancelled"  # the claim predates the cancel: a checkpoint tells it
    assert run_of(run).status == "cancelled"
    assert ledger_counts(run.pk) == {"a": 1}  # step a ran, its checkpoint said "cancel", b never started


def test_the_example_refund_approval_waits_for_a_person(django_user_model):
    from django.contrib.auth.models import Permission

    from example_project.orders.models import Order
    from example_project.orders.workflows import create_demo_order

    permission = Permission.objects.get(codename="approve_refund", content_type__app_label="orders")
    ada, bob = (django_user_model.objects.create_user(name, password="a-long-password") for name in ("ada", "bob"))
    for user in (ada, bob):
        user.user_permissions.add(permission)
    ada, bob = (django_user_model.objects.get(pk=user.pk) for user in (ada, bob))
    approved_order, rejected_order, forgotten_order = (create_demo_order(c, "5.00") for c in "ABC")
    with clock() as test_clock:
        approved = durable.start("orders.approve_refund", order_id=approved_order.pk, amount="5.00")
        rejected = durable.start("orders.approve_refund", order_id=rejected_order.pk, amount="5.00")
        forgotten = durable.start("orders.approve_refund", order_id=forgotten_order.pk, amount="5.00")
        drain()
        assert run_of(approved).waiting_on.startswith("approval 'approval' until")
        durable.decide(approved.pk, "approval", ada, approve=True)
        durable.decide(rejected.pk, "approval", bob, approve=False, comment="not this one")
        drain()
        test_clock.advance(days=2)
        drain()
    assert run_of(approved).get_result() == {"refunded": True, "approved_by": ["ada"]}
    assert run_of(rejected).get_result() == {"refunded": False, "reason": "rejected by bob"}
    assert run_of(forgotten).get_result() == {"refunded": False, "reason": "nobody decided within two days"}
    assert Order.objects.get(pk=approved_order.pk).status == "refunded"
    assert Order.objects.get(pk=rejected_order.pk).status == "shipped"  # as it was

@durable.workflow("tests.waits.answered")
def answered(ctx):
    two_days = dt.timedelta(days=2)
    got = [ctx.wait_for_signal("a", timeout=two_days)]
    update = ctx.wait_for_update("u", timeout=two_days)
    update.answer("taken")
    got.append(update.payload)
    got.append(ctx.wait_for_event("e", {"n": 1}, timeout=two_days))
    got.append(ctx.wait_for_approval("ok", approvers="auth.change_user", timeout=two_days)["approved"])
    got.append(ctx.wait_for_signal("last", timeout=dt.timedelta(minutes=5)))
    return got


def pending_timers(run) -> list[str]:
    return sorted(Timer.objects.filter(run_id=run.pk, status="pending").values_list("step_key", flat=True))


def test_a_wait_answered_before_its_timeout_leaves_no_timer_behind(admin_user):
    from django_durable.services import updates

    with clock() as test_clock:
        run = durable.start(answered)
        drain()
        assert pending_timers(run) == ["signal:a:0"]
        durable.signal(run.pk, "a", 1)
        drain()
        assert pending_timers(run) == ["update:u:0"]
        updates.send(run.pk, "u", 2)
        drain()
        assert pending_timers(run) == ["event:e:0"]
        durable.emit_event("e", {"n": 1})
        drain()
        assert pending_timers(run) == ["ok"]
        durable.decide(run.pk, "ok", admin_user, approve=True)
        drain()
        # Only the live wait's timer: the run list shows when it times out, not a dead one's.
        assert pending_timers(run) == ["signal:last:0"]
        assert Timer.objects.filter(run_id=run.pk, status="cancelled").count() == 4

        test_clock.advance(days=3)  # past every answered wait's timeout: none fires
        assert drain() == 1
    assert run_of(run).status == "failed" and "No signal 'last'" in run_of(run).get_error()["message"]
    assert Timer.objects.filter(run_id=run.pk, status="fired").count() == 1


def test_the_examples_ask_a_refund_only_of_a_shipped_order_and_a_new_one_asks_nobody():
    import io

    from django.core.management import call_command

    from django_durable.models import Approval
    from example_project.orders.models import Order

    call_command("start_examples", stdout=io.StringIO())
    drain()
    (asked,) = Approval.objects.all()
    assert Order.objects.get(pk=asked.run.get_input()["kwargs"]["order_id"]).status == "shipped"

    never_shipped = Order.objects.create(customer="Nobody", total="5.00")
    run = durable.start("orders.approve_refund", order_id=never_shipped.pk, amount="5.00")
    drain()
    assert run_of(run).get_result() == {"refunded": False, "reason": f"order {never_shipped.pk} is new, not shipped"}
    assert Approval.objects.count() == 1
