"""Workflows the test suite runs, in-process and in real worker subprocesses."""

import datetime as dt
import os
import time
import uuid
from decimal import Decimal

import django_durable as durable

from . import ledger
from .models import Payment


def wait_for_file(path, timeout=120.0):
    """Wait until `path` exists; a test that never creates it fails here instead of hanging."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.02)


def hold_once():
    """With DURABLE_TEST_AGENT_HOLD, the first call (in any process) touches <hold>.held and waits
    for <hold>.go: a worker can be killed while it is inside."""
    hold = os.environ.get("DURABLE_TEST_AGENT_HOLD")
    if hold and not os.path.exists(hold + ".held"):
        with open(hold + ".held", "w"):
            pass
        wait_for_file(hold + ".go")


def mark(run_id, step, value=None):
    ledger.record(run_id, step)
    return value if value is not None else step


def mark_and_block(run_id, step, reached, release):
    """Record the execution; on the first execution only, say so and wait for `release`."""
    ledger.record(run_id, step)
    if ledger.count(run_id, step) == 1:
        open(reached, "a").close()
        wait_for_file(release)
    return step


def mark_and_sleep(run_id, step, seconds, reached=None):
    """Record the execution; on the first execution only, sleep `seconds`."""
    ledger.record(run_id, step)
    if reached:
        open(reached, "a").close()
    if ledger.count(run_id, step) == 1:
        time.sleep(seconds)
    return step


def pay(run_id, amount):
    ledger.record(run_id, "pay")
    Payment.objects.create(run_id=run_id, amount=amount)
    return {"amount": amount}


def timed(run_id, seconds):
    """Record when this execution starts and ends (time.time()), for the queue-limit tests."""
    ledger.record(run_id, f"start:{time.time():.6f}")
    time.sleep(seconds)
    ledger.record(run_id, f"end:{time.time():.6f}")


@durable.workflow("tests.timed")
def timed_run(ctx, seconds=0.0):
    ctx.step("timed", timed, ctx.run_id, seconds)


@durable.workflow("tests.three_steps")
def three_steps(ctx, x=1):
    a = ctx.step("a", mark, ctx.run_id, "a", x)
    b = ctx.step("b", mark, ctx.run_id, "b", a + 1)
    c = ctx.step("c", mark, ctx.run_id, "c", b + 1)
    return [a, b, c]


def fixed_later(run_id, fix_path):
    """A step with a bug until `fix_path` exists (a deploy of the fix): it fails for good before."""
    ledger.record(run_id, "b")
    if not os.path.exists(fix_path):
        raise durable.NonRetryableError("the bug in b")
    return 10


def process_state():
    """What the process running the step holds: the objects frozen out of the collector's sight,
    whether the collector is on, and the collections made while the worker started (those
    tests/settings.py counted, when DURABLE_TEST_COUNT_COLLECTIONS is set)."""
    import gc

    from tests import settings

    return {"frozen": gc.get_freeze_count(), "collecting": gc.isenabled(),
            "start_collections": len(settings.start_collections)}


@durable.workflow("tests.process_state")
def process_state_workflow(ctx):
    return ctx.step("state", process_state)


@durable.workflow("tests.fork_me")
def fork_me(ctx, fix_path):
    """Fails at step b until its fix is deployed: durable.fork() from b runs b and c again, not a."""
    a = ctx.step("a", mark, ctx.run_id, "a", 1)
    ctx.set_progress(1, 3, "a done")
    ctx.note("after a")
    b = ctx.step("b", fixed_later, ctx.run_id, fix_path)
    c = ctx.step("c", mark, ctx.run_id, "c", a + b)
    return [a, b, c]


@durable.workflow("tests.cart")
def cart(ctx, reached="", release=""):
    """Takes updates "add" (an item: answers how many are in the cart; one already in it is
    refused) until "checkout" (answers the items and ends). Pricing an item is a step that, given
    `reached` and `release`, says it started and waits for `release` the first time it runs."""
    items = []
    while True:
        update = ctx.wait_for_update("add")
        if update.payload == "checkout":
            update.answer({"items": items})
            return items
        if update.payload in items:
            update.reject(f"{update.payload} is in the cart already")
            continue
        if reached:
            ctx.step(f"price:{len(items)}", mark_and_block, ctx.run_id, f"price:{len(items)}", reached, release)
        items.append(update.payload)
        update.answer({"count": len(items)})


@durable.workflow("tests.streamer")
def streamer(ctx, n=3, gap=0.0):
    """Writes n tokens to its stream "tokens" (a durable sleep of `gap` seconds between them), a
    note and a step on the way, then closes the stream."""
    ctx.step("prepare", mark, ctx.run_id, "prepare")
    for i in range(n):
        ctx.write_stream("tokens", f"t{i}")
        if gap:
            ctx.sleep(f"gap:{i}", gap)
    ctx.note("all written", count=n)
    ctx.close_stream("tokens")
    return n


@durable.workflow("tests.marked")
def marked(ctx, label="a", steps=1):
    """`steps` steps, each recording `label` in the ledger: the order the runs' steps ran in."""
    for i in range(steps):
        ctx.step(f"mark:{i}", mark, ctx.run_id, label)
    return label


@durable.workflow("tests.echo")
def echo(ctx, *args, **kwargs):
    """Takes anything: returns what it was given."""
    return {"args": list(args), "kwargs": kwargs}


def price():
    return Decimal("42.00")


@durable.workflow("tests.money")
def money(ctx):
    """Values JSON has no type for, as a result and as a step's result."""
    total = ctx.step("price", price)
    return {"total": total, "order": uuid.UUID("6a3b2c1d-0000-4000-8000-0000000000aa"),
            "at": dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.timezone.utc), "took": dt.timedelta(minutes=5),
            "when": dt.date(2026, 11, 23)}


@durable.workflow("tests.five_steps")
def five_steps(ctx):
    return [ctx.step(f"s{i}", mark, ctx.run_id, f"s{i}", i) for i in range(5)]


@durable.workflow("tests.block_in_b")
def block_in_b(ctx, reached, release):
    ctx.step("a", mark, ctx.run_id, "a")
    ctx.step("b", mark_and_block, ctx.run_id, "b", reached, release)
    ctx.step("c", mark, ctx.run_id, "c")
    return "done"


def speak(words, fail_after=None, hold_dir=None, hold_at=0):
    """A step that writes each of `words` to the stream "tokens" as it goes (an LLM answering).

    With `fail_after`, its first attempt raises after that many words. With `hold_dir`, its first
    execution touches <dir>/held after writing word `hold_at` and waits for <dir>/go (a test reads
    the stream, or kills the worker, meanwhile); later executions go straight through."""
    info = durable.current_step()
    for i, word in enumerate(words):
        info.write_stream("tokens", word)
        if hold_dir and i == hold_at and not os.path.exists(os.path.join(hold_dir, "held")):
            with open(os.path.join(hold_dir, "held"), "w"):
                pass
            wait_for_file(os.path.join(hold_dir, "go"))
        if fail_after is not None and i + 1 == fail_after and info.attempt == 1:
            raise RuntimeError(f"failed after {fail_after} words")
    return " ".join(words)


async def aspeak(words):
    info = durable.current_step()
    for word in words:
        await info.awrite_stream("tokens", word)
    return " ".join(words)


@durable.workflow("tests.speaker", retry=durable.RetryPolicy(max_attempts=3, initial_backoff=0))
def speaker(ctx, words, fail_after=None, hold_dir=None, hold_at=0, asynchronous=False):
    ctx.step("prepare", mark, ctx.run_id, "prepare")
    if asynchronous:
        answer = ctx.step("answer", aspeak, words)
    else:
        answer = ctx.step("answer", speak, words, fail_after, hold_dir, hold_at)
    ctx.write_stream("tokens", "[done]")
    return answer


@durable.workflow("tests.sleep_in_b")
def sleep_in_b(ctx, seconds, reached=None):
    ctx.step("a", mark, ctx.run_id, "a")
    ctx.step("b", mark_and_sleep, ctx.run_id, "b", seconds, reached)
    ctx.step("c", mark, ctx.run_id, "c")
    return "done"


@durable.workflow("tests.atomic_pay")
def atomic_pay(ctx, amount):
    paid = ctx.step("pay", pay, ctx.run_id, amount, atomic=True)
    ctx.step("after", mark, ctx.run_id, "after")
    return paid


def pay_and_block(run_id, amount, reached, release):
    """pay(); on the first execution only, then say so and wait for `release`, its transaction
    open (an atomic step's: the payment commits with the checkpoint or not at all)."""
    paid = pay(run_id, amount)
    if ledger.count(run_id, "pay") == 1:
        open(reached, "a").close()
        wait_for_file(release)
    return paid


@durable.workflow("tests.pay_in_b")
def pay_in_b(ctx, amount, reached, release):
    ctx.step("a", mark, ctx.run_id, "a")
    paid = ctx.step("b", pay_and_block, ctx.run_id, amount, reached, release, atomic=True)
    ctx.step("c", mark, ctx.run_id, "c")
    return paid


@durable.workflow("tests.plain_pay")
def plain_pay(ctx, amount):
    """atomic_pay without atomic=True: the payment commits on its own (test_own_database)."""
    return ctx.step("pay", pay, ctx.run_id, amount)


@durable.workflow("tests.short_lived", retention=3600)
def short_lived(ctx):
    """Its finished runs are kept for an hour (test_retention)."""
    return ctx.step("a", mark, ctx.run_id, "a")


@durable.workflow("tests.kept_long", retention=dt.timedelta(days=90))
def kept_long(ctx):
    """Its finished runs are kept for 90 days (test_retention)."""
    return ctx.step("a", mark, ctx.run_id, "a")


def big_value(lines):
    return [f"line {i:08d} " + "x" * 100 for i in range(lines)]


@durable.workflow("tests.big_payloads")
def big_payloads(ctx, data=None, wait_for_signal=False):
    """A big step result, and a big result when asked (test_payloads): each may be stored apart."""
    value = ctx.step("big", big_value, 50)
    signalled = ctx.wait_for_signal("more") if wait_for_signal else None
    return {"lines": len(value), "last": value[-1], "input": len(data or []), "signal": len(signalled or []),
            "echo": value if wait_for_signal else None}


@durable.workflow("tests.trivial")
def trivial(ctx, n=10):
    total = 0
    for i in range(n):
        total += ctx.step(f"s{i}", int, i)
    return total


@durable.workflow("tests.raises")
def raises(ctx, message="missing thing"):
    ctx.step("ok", mark, ctx.run_id, "ok")
    raise KeyError(message)


def fail_first(run_id, key):
    """Fail on the first execution for this run, succeed afterwards."""
    ledger.record(run_id, key)
    if ledger.count(run_id, key) == 1:
        raise ConnectionError("the first attempt fails")
    return "ok"


def fail_times(run_id, key, times):
    """Fail the first `times` executions for this run (each with its own message), then succeed."""
    ledger.record(run_id, key)
    count = ledger.count(run_id, key)
    if count <= times:
        raise ConnectionError(f"{key} execution {count} fails")
    return count


@durable.workflow("tests.fails_twice")
def fails_twice(ctx):
    """A step and a branch that each fail twice, then succeed on their third attempt."""
    again = durable.RetryPolicy(max_attempts=3, initial_backoff=0, jitter=0)
    step = ctx.step("step", fail_times, ctx.run_id, "step", 2, retry=again)
    branch = ctx.parallel([ctx.call("branch", fail_times, ctx.run_id, "branch", 2, retry=again)], key="group")
    return [step, *branch]


@durable.workflow("tests.retry_after_backoff")
def retry_after_backoff(ctx, backoff=2.0):
    policy = durable.RetryPolicy(max_attempts=3, initial_backoff=backoff, jitter=0)
    return ctx.step("call", fail_first, ctx.run_id, "call", retry=policy)


def ignores_timeouts(run_id, key):
    """On the first execution, refuse to stop: swallow every StepTimeout, forever."""
    ledger.record(run_id, key)
    if ledger.count(run_id, key) == 1:
        while True:
            try:
                time.sleep(60)
            except durable.StepTimeout:
                pass
    return "never stuck twice"


@durable.workflow("tests.stuck_step")
def stuck_step(ctx):
    try:
        return ctx.step("stuck", ignores_timeouts, ctx.run_id, "stuck", timeout=1,
                        retry=durable.RetryPolicy(max_attempts=1))
    except durable.StepTimeout:
        return "unreachable: StepTimeout is not raised into the workflow"
    except durable.StepFailed as failure:
        return failure.type


@durable.workflow("tests.timed_block")
def timed_block(ctx, reached, release):
    try:
        ctx.step("b", mark_and_block, ctx.run_id, "b", reached, release, timeout=1,
                 retry=durable.RetryPolicy(max_attempts=1))
    except durable.StepFailed as failure:
        return failure.type
    return "finished in time"


def crash_the_worker(run_id):
    ledger.record(run_id, "boom")
    os._exit(1)


@durable.workflow("tests.poison")
def poison(ctx):
    ctx.step("before", mark, ctx.run_id, "before")
    ctx.step("boom", crash_the_worker, ctx.run_id)


@durable.workflow("tests.sleeper")
def sleeper(ctx, seconds):
    before = ctx.step("before", mark, ctx.run_id, "before")
    ctx.sleep("nap", seconds)
    after = ctx.step("after", mark, ctx.run_id, "after")
    return [before, after]


@durable.workflow("tests.two_signals")
def two_signals(ctx, reached=None, release=None):
    if reached:
        ctx.step("first", mark_and_block, ctx.run_id, "first", reached, release)
    first = ctx.wait_for_signal("go")
    ctx.step("between", mark, ctx.run_id, "between")
    second = ctx.wait_for_signal("go")
    return [first, second]


@durable.workflow("tests.approval")
def approval(ctx, timeout=None):
    try:
        decision = ctx.wait_for_signal("approved", timeout=timeout)
    except durable.SignalTimeout:
        return "timed out"
    return decision


@durable.workflow("tests.payment_waiter")
def payment_waiter(ctx, order_id, timeout=None):
    try:
        event = ctx.wait_for_event("payment.settled", match={"order.id": order_id}, timeout=timeout)
    except durable.SignalTimeout:
        return "no payment"
    return event["amount"]


@durable.workflow("tests.cooperative_cancel")
def cooperative_cancel(ctx, reached):
    def long_step():
        ledger.record(ctx.run_id, "long")
        open(reached, "a").close()
        for _ in range(600):  # up to 30 s
            if ctx.cancel_requested:
                return "stopped early"
            time.sleep(0.05)
        return "ran to the end"

    ctx.step("long", long_step)
    ctx.step("never", mark, ctx.run_id, "never")


@durable.workflow("tests.cancellable")
def cancellable(ctx, reached):
    ctx.step("first", mark_and_block, ctx.run_id, "first", reached, reached)  # reached == release: no wait
    ctx.step("long", mark_and_sleep, ctx.run_id, "long", 3)
    ctx.step("never", mark, ctx.run_id, "never")
    return "completed"


# -- composition -----------------------------------------------------------------------------------


def square(run_id, x):
    ledger.record(run_id, f"square:{x}")
    return {"x": x, "square": x * x, "pid": os.getpid()}


def fail_on(run_id, x, bad):
    ledger.record(run_id, f"item:{x}")
    if x == bad:
        raise durable.NonRetryableError(f"item {x} is bad")
    return x


def square_item(item):
    run_id, x = item
    return square(run_id, x)


@durable.workflow("tests.graph_live")
def graph_live(ctx, n=12):
    """A step, a wait for "go", a fan-out of n, a child: the run graph followed live (test_admin_browser)."""
    ctx.step("prepare", mark, ctx.run_id, "prepare", n)
    ctx.wait_for_signal("go")
    squares = ctx.map("square", square_item, [(ctx.run_id, i) for i in range(n)])
    ctx.child("report", "tests.three_steps", x=len(squares))
    return len(squares)


@durable.workflow("tests.repairable")
def repairable(ctx, order):
    """One step: runs made failed by hand, then repaired by filter (test_repairs)."""
    return ctx.step("charge", mark, ctx.run_id, "charge", order)


def declined_while(run_id, key, flag):
    """Raise (a retryable error) while the file `flag` exists."""
    ledger.record(run_id, key)
    if os.path.exists(flag):
        raise ValueError(f"card declined while {os.path.basename(flag)} exists")
    return key


@durable.workflow("tests.pauses", retry=durable.RetryPolicy(max_attempts=2, initial_backoff=0, jitter=0,
                                                            on_exhausted="pause"))
def pauses(ctx, flag):
    """A step before, a child and a wait for "go", then a step that pauses the run while `flag` exists (test_pause)."""
    ctx.step("before", mark, ctx.run_id, "before")
    ctx.start_child("kid", "tests.approval")
    ctx.wait_for_signal("go")
    return ctx.step("charge", declined_while, ctx.run_id, "charge", flag)


@durable.workflow("tests.pauses_a_branch", retry=durable.RetryPolicy(max_attempts=2, initial_backoff=0, jitter=0,
                                                                     on_exhausted="pause"))
def pauses_a_branch(ctx, flag):
    """Two parallel branches; "card" pauses the run while `flag` exists (test_pause)."""
    return ctx.parallel([ctx.call("ok", mark, ctx.run_id, "ok"), ctx.call("card", declined_while, ctx.run_id, "card", flag)],
                        key="pay")


@durable.workflow("tests.squares")
def squares(ctx, n):
    return ctx.parallel([ctx.call(f"sq:{i}", square, ctx.run_id, i) for i in range(n)], key="sq")


@durable.workflow("tests.map_squares")
def map_squares(ctx, n):
    return [r["square"] for r in ctx.map("m", square_item, [(ctx.run_id, i) for i in range(n)])]


@durable.workflow("tests.fail_fast")
def fail_fast(ctx, n, bad, collect=False):
    results = ctx.parallel([ctx.call(f"item:{i}", fail_on, ctx.run_id, i, bad) for i in range(n)],
                           key="items", return_exceptions=collect)
    if collect:
        return [r if not isinstance(r, durable.StepFailed) else f"failed: {r.message}" for r in results]
    return results


def fail_first_time(run_id, x, bad):
    """Raise (for good) on the first execution of item `bad`; succeed after."""
    ledger.record(run_id, f"item:{x}")
    if x == bad and ledger.count(run_id, f"item:{x}") == 1:
        raise durable.NonRetryableError(f"item {x} fails the first time")
    return x


@durable.workflow("tests.retried_fan_out", max_attempts=2, retry=durable.RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=0))
def retried_fan_out(ctx, n, bad):
    return ctx.parallel([ctx.call(f"item:{i}", fail_first_time, ctx.run_id, i, bad) for i in range(n)], key="items")


def charge(run_id, amount):
    ledger.record(run_id, "charge")
    return {"charge_id": f"ch_{amount}"}


def refund(run_id, charge):
    ledger.record(run_id, "refund")
    return {"refunded": charge["charge_id"]}


def reserve(run_id, sku):
    ledger.record(run_id, "reserve")
    return {"reservation": sku}


def release(run_id, reservation, fail_times=0, block=None):
    ledger.record(run_id, "release")
    if block and ledger.count(run_id, "release") == 1:
        open(block + ".reached", "a").close()
        wait_for_file(block)
    if ledger.count(run_id, "release") <= fail_times:
        raise durable.NonRetryableError("the warehouse is down")
    return {"released": reservation["reservation"]}


def ship(run_id):
    ledger.record(run_id, "ship")
    raise durable.NonRetryableError("no courier")


@durable.workflow("tests.saga")
def saga(ctx, release_fails=0, block=None, automatic=False):
    charged = ctx.step("charge", charge, ctx.run_id, 10, compensate=lambda c: refund(ctx.run_id, c))
    ctx.step("reserve", reserve, ctx.run_id, "sku-1",
             compensate=lambda r: release(ctx.run_id, r, release_fails, block))
    if automatic:  # a failure rolls back by itself (compensate_on_failure)
        ctx.step("ship", ship, ctx.run_id)
        return {"rolled_back": False}
    try:
        ctx.step("ship", ship, ctx.run_id)
    except durable.StepFailed:
        ctx.rollback()
        return {"rolled_back": True, "charge": charged}
    return {"rolled_back": False}


@durable.workflow("tests.saga_auto", compensate_on_failure=True)
def saga_auto(ctx, release_fails=0, block=None):
    return saga(ctx, release_fails, block, automatic=True)


@durable.workflow("tests.saga_on_cancel", compensate_on_cancel=True)
def saga_on_cancel(ctx):
    ctx.step("charge", charge, ctx.run_id, 5, compensate=lambda c: refund(ctx.run_id, c))
    ctx.wait_for_signal("never")


@durable.workflow("tests.child_adder")
def child_adder(ctx, a, b):
    return ctx.step("add", mark, ctx.run_id, "add", a + b)


@durable.workflow("tests.child_breaker")
def child_breaker(ctx):
    ctx.step("break", ship, ctx.run_id)


@durable.workflow("tests.parent")
def parent(ctx):
    total = ctx.child("sum", "tests.child_adder", 2, 3)
    later = ctx.start_child("later", child_adder, 10, 20)
    try:
        ctx.child("broken", "tests.child_breaker")
    except durable.ChildFailed as failure:
        caught = failure.message
    return {"sum": total, "later": later.result(), "caught": caught}


@durable.workflow("tests.recursive")
def recursive(ctx, index=0):
    ctx.sleep("nap", 0.001)
    if index >= 9:
        return {"count": 1}
    return {"count": 1 + ctx.child("next", recursive, index + 1)["count"]}


@durable.workflow("tests.waiting_parent")
def waiting_parent(ctx):
    ctx.start_child("a", "tests.approval")
    ctx.start_child("b", "tests.sleeper", 3600)
    return ctx.wait_for_signal("never")


def mark_and_pause(run_id, step, value, seconds):
    ledger.record(run_id, step)
    time.sleep(seconds)
    return value


@durable.workflow("tests.ten_steps")
def ten_steps(ctx, pause=0.02):
    """Ten steps, each recorded in the ledger under its own key (tests/harness/failover.py): 45."""
    return sum(ctx.step(f"s{i}", mark_and_pause, ctx.run_id, f"s{i}", i, pause) for i in range(10))


@durable.workflow("tests.lives_long")
def lives_long(ctx, gap=1.0):
    """A step, then a wait of `gap` seconds for the signal "enough", again and again until it
    comes (tests/harness/failover.py: one run's life through every failover); return how many
    steps ran, each recorded in the ledger under its own key."""
    n = 0
    while True:
        ctx.step(f"s{n}", mark, ctx.run_id, f"s{n}")
        n += 1
        try:
            ctx.wait_for_signal("enough", timeout=gap)
            return n
        except durable.SignalTimeout:
            pass


@durable.workflow("tests.naps")
def naps(ctx, n=6, seconds=0.5):
    """`n` steps that each sleep `seconds` (tests/harness/outage.py: a database outage mid-run)."""
    return [ctx.step(f"nap{i}", nap, ctx.run_id, seconds) for i in range(n)]


@durable.workflow("tests.map_pids")
def map_pids(ctx, n):
    return [r["pid"] for r in ctx.map("m", square_item, [(ctx.run_id, i) for i in range(n)])]


def nap(run_id, seconds):
    ledger.record(run_id, f"nap:{seconds}")
    time.sleep(seconds)
    return seconds


@durable.workflow("tests.branch_timeouts")
def branch_timeouts(ctx):
    once = durable.RetryPolicy(max_attempts=1)
    results = ctx.parallel([ctx.call("fast", nap, ctx.run_id, 0, timeout=5, retry=once),
                            ctx.call("slow", nap, ctx.run_id, 30, timeout=0.5, retry=once)],
                           return_exceptions=True)
    return [r if not isinstance(r, durable.StepFailed) else r.type for r in results]


@durable.workflow("tests.tick")
def tick(ctx, label="tick"):
    return ctx.step("note", mark, ctx.run_id, label)


@durable.workflow("tests.nightly", schedule={"cron": "0 3 * * *", "timezone": "Europe/Paris"})
def nightly(ctx):
    return "report"


# -- operator actions -------------------------------------------------------------------------------


def fails_while_flagged(run_id, key, flag):
    """Fail for good while the file `flag` exists."""
    ledger.record(run_id, key)
    if os.path.exists(flag):
        raise durable.NonRetryableError(f"{key} is broken while {os.path.basename(flag)} exists")
    return key


@durable.workflow("tests.flaky_middle")
def flaky_middle(ctx, flag):
    a = ctx.step("a", mark, ctx.run_id, "a")
    b = ctx.step("b", fails_while_flagged, ctx.run_id, "b", flag)
    c = ctx.step("c", mark, ctx.run_id, "c")
    return [a, b, c]


@durable.workflow("tests.flaky_child")
def flaky_child(ctx, flag):
    return ctx.step("work", fails_while_flagged, ctx.run_id, "work", flag)


@durable.workflow("tests.flaky_parent")
def flaky_parent(ctx, flag):
    before = ctx.step("before", mark, ctx.run_id, "before")
    return [before, ctx.child("kid", flaky_child, flag)]


@durable.workflow("tests.edited")
def edited(ctx):
    a = ctx.step("a", mark, ctx.run_id, "a", 1)
    ctx.wait_for_signal("go")
    return a


@durable.workflow("tests.timed_waiter", timeout=60)
def timed_waiter(ctx):
    ctx.step("a", mark, ctx.run_id, "a")
    ctx.wait_for_signal("go")
    return "done"


@durable.workflow("tests.slow_branch")
def slow_branch(ctx):
    slow = durable.RetryPolicy(max_attempts=3, initial_backoff=3600, jitter=0)
    return ctx.parallel([ctx.call("ok", mark, ctx.run_id, "ok"),
                         ctx.call("flaky", fail_first, ctx.run_id, "flaky", retry=slow)], key="both")


def reserve_stock(run_id, sku):
    ledger.record(run_id, f"reserve:{sku}")
    time.sleep(0.02)
    return {"sku": sku, "reserved": True}


def flaky_quote(run_id, carrier):
    """A carrier quote that fails its first attempt."""
    ledger.record(run_id, f"quote:{carrier}")
    time.sleep(0.01)
    if ledger.count(run_id, f"quote:{carrier}") == 1:
        raise ConnectionError(f"{carrier} timed out")
    return {"carrier": carrier, "price": 12}


def charge_card(run_id, amount):
    ledger.record(run_id, "charge")
    raise ValueError(f"card declined for {amount} EUR")


@durable.workflow("tests.showcase")
def showcase(ctx, order_id):
    """Steps, a parallel fan-out with a retried branch, a durable sleep, then a failing step."""
    order = ctx.step("load-order", mark, ctx.run_id, "load-order", {"order": order_id, "total": 42})
    once = durable.RetryPolicy(max_attempts=3, initial_backoff=0, jitter=0)
    ctx.parallel([ctx.call(f"reserve:{sku}", reserve_stock, ctx.run_id, sku) for sku in ("A-1", "B-2", "C-3")]
                 + [ctx.call("quote:ups", flaky_quote, ctx.run_id, "ups", retry=once)], key="prepare")
    ctx.sleep("cool-off", 0.3)
    ctx.step("charge", charge_card, ctx.run_id, order["total"], retry=durable.RetryPolicy(max_attempts=1))


# -- a parent's ending and its children -------------------------------------------------------------


@durable.workflow("tests.failing_parent")
def failing_parent(ctx):
    """Start a child with children of its own and a detached one, then fail."""
    ctx.start_child("kid", "tests.waiting_parent")
    ctx.start_child("free", "tests.approval", detached=True)
    ctx.wait_for_signal("fail")
    ctx.step("boom", ship, ctx.run_id)


@durable.workflow("tests.parent_with_deadline", timeout=60)
def parent_with_deadline(ctx):
    ctx.start_child("kid", "tests.approval")
    ctx.wait_for_signal("never")


@durable.workflow("tests.parent_leaves_child")
def parent_leaves_child(ctx):
    ctx.start_child("kid", "tests.approval")
    return "done"


@durable.workflow("tests.approval_twice")
def approval_twice(ctx, timeout):
    """A wait with a timeout, then one without: a signal that lost to the timeout goes to the second."""
    try:
        first = ctx.wait_for_signal("approved", timeout=timeout)
    except durable.SignalTimeout:
        first = "timed out"
    return [first, ctx.wait_for_signal("approved")]


@durable.workflow("tests.fan_out_waits")
def fan_out_waits(ctx, n, timeout):
    """Children waiting in parallel, each with its own timeout."""
    handles = [ctx.start_child(f"w{i}", "tests.approval", timeout=timeout) for i in range(n)]
    return [handle.result() for handle in handles]


# -- durations measured on the database's clock -----------------------------------------------------


def db_clock():
    """The database's clock now (SQLite's clock is this machine's)."""
    from django.db import connection
    from django.utils import timezone

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]
    return timezone.now()


def fail_once_timed(run_id):
    """Note the database's clock at each attempt; the first one fails."""
    ledger.record(run_id, f"attempt@{db_clock().timestamp()!r}")
    if sum(ledger.counts(run_id).values()) == 1:
        raise ConnectionError("the first attempt fails")
    return "ok"


@durable.workflow("tests.measured_sleep")
def measured_sleep(ctx, seconds):
    before = ctx.step("before", db_clock)
    ctx.sleep("nap", seconds)
    return [before, ctx.step("after", db_clock)]


@durable.workflow("tests.measured_backoff")
def measured_backoff(ctx, seconds):
    policy = durable.RetryPolicy(max_attempts=2, initial_backoff=seconds, jitter=0)
    return ctx.step("flaky", fail_once_timed, ctx.run_id, retry=policy)


@durable.workflow("tests.measured_timeout")
def measured_timeout(ctx, seconds):
    before = ctx.step("before", db_clock)
    try:
        ctx.wait_for_signal("never", timeout=seconds)
    except durable.SignalTimeout:
        pass
    return [before, ctx.step("after", db_clock)]


# -- cancels that reach running steps -------------------------------------------------------------------


def long_sleep(run_id, key, seconds, reached=None):
    """Record the start, sleep in one blocking call, record the end."""
    ledger.record(run_id, f"{key}:start")
    if reached:
        open(reached, "a").close()
    time.sleep(seconds)
    ledger.record(run_id, f"{key}:end")
    return key


def polite_loop(run_id, reached):
    """Stop as soon as durable.current_step() says the run was cancelled."""
    ledger.record(run_id, "polite:start")
    open(reached, "a").close()
    for _ in range(600):
        if durable.current_step().cancel_requested:
            return "noticed"
        time.sleep(0.05)
    return "ran to the end"


@durable.workflow("tests.long_step")
def long_step(ctx, reached, seconds=30, cancellable=True):
    ctx.step("long", long_sleep, ctx.run_id, "long", seconds, reached, cancellable=cancellable)
    ctx.step("never", mark, ctx.run_id, "never")


@durable.workflow("tests.long_atomic_step")
def long_atomic_step(ctx, reached):
    ctx.step("pay", pay, ctx.run_id, 1, atomic=True)
    ctx.step("long", long_sleep, ctx.run_id, "long", 30, reached, atomic=True)
    ctx.step("never", mark, ctx.run_id, "never")


@durable.workflow("tests.polite_step")
def polite_step(ctx, reached):
    noticed = ctx.step("polite", polite_loop, ctx.run_id, reached)
    ctx.step("never", mark, ctx.run_id, "never")
    return noticed


@durable.workflow("tests.long_saga", compensate_on_cancel=True)
def long_saga(ctx, reached):
    ctx.step("charge", charge, ctx.run_id, 5, compensate=lambda c: refund(ctx.run_id, c))
    ctx.step("long", long_sleep, ctx.run_id, "long", 30, reached)
    ctx.step("never", mark, ctx.run_id, "never")


def long_branch(item):
    run_id, index, reached = item
    return long_sleep(run_id, f"branch{index}", 30, reached if index == 0 else None)


@durable.workflow("tests.long_branches")
def long_branches(ctx, reached):
    return ctx.map("b", long_branch, [(ctx.run_id, i, reached) for i in range(2)])


if not os.environ.get("DURABLE_TEST_OLD_RELEASE"):
    # Code of the "new release": a worker started with DURABLE_TEST_OLD_RELEASE=1 does not have it.
    @durable.workflow("tests.new_release")
    def new_release(ctx):
        return ctx.step("new", mark, ctx.run_id, "new")


@durable.workflow("tests.atomic_timed")
def atomic_timed(ctx):
    return ctx.step("pay", pay, ctx.run_id, 3, atomic=True, timeout=1, retry=durable.RetryPolicy(max_attempts=1))


@durable.workflow("tests.nested_steps")
def nested_steps(ctx, nap):
    def outer():
        ctx.step("inner", mark, ctx.run_id, "inner", timeout=30)
        time.sleep(nap)
        return "slept"

    try:
        return ctx.step("outer", outer, timeout=1, retry=durable.RetryPolicy(max_attempts=1))
    except durable.StepFailed as failure:
        return failure.type


from . import chaos  # noqa: E402,F401 - the chaos soak's workflows, registered in every test worker


def always_fails(run_id):
    ledger.record(run_id, "fail")
    raise ConnectionError("the service is down")


@durable.workflow("tests.always_failing")
def always_failing(ctx, backoff):
    """Fails its step for ever, waiting out a back-off between attempts (RELIABILITY T29)."""
    policy = durable.RetryPolicy(max_attempts=1000, initial_backoff=backoff, backoff_coefficient=1, jitter=0)
    return ctx.step("call", always_fails, ctx.run_id, retry=policy)



@durable.workflow("tests.ships_and_tells")
def ships_and_tells(ctx, order_id):
    """Ships an order, then emits order.shipped (to the runs waiting for it and as a Django signal)."""
    ctx.step("ship", mark, ctx.run_id, "ship")
    delivered = ctx.emit("order.shipped", {"order": order_id})
    ctx.step("after", mark, ctx.run_id, "after")
    return delivered


@durable.workflow("tests.awaits_shipping")
def awaits_shipping(ctx, order_id):
    return ctx.wait_for_event("order.shipped", match={"order": order_id}, timeout=600)


@durable.workflow("tests.charges_twice")
def charges_twice(ctx, order_id):
    """A deploy changes the amount it charges (TESTAPP_CHARGE_CENTS, the version of the code the
    worker runs): runs charged before the deploy must not replay under the new amount."""
    cents = int(os.environ.get("TESTAPP_CHARGE_CENTS", "1000"))
    ctx.step("charge", mark, ctx.run_id, "charge", {"order": order_id, "cents": cents})
    ctx.wait_for_signal("shipped")
    ctx.step("receipt", mark, ctx.run_id, "receipt")
    return cents


@durable.workflow("tests.refund_approval")
def refund_approval(ctx, amount, approvers="testapp.approve_refund", quorum=1, timeout=None):
    """Waits for people to approve a refund (ctx.wait_for_approval); a timeout gives {"approved": None}."""
    try:
        decision = ctx.wait_for_approval("refund", approvers=approvers, quorum=quorum, timeout=timeout,
                                         message=f"Refund {amount} EUR?", data={"amount": amount})
    except durable.ApprovalTimeout:
        return {"approved": None}
    ctx.step("after", mark, ctx.run_id, "after")
    return decision


@durable.workflow("tests.ticket_flow", one_at_a_time=True)
def ticket_flow(ctx, ticket_id):
    """Runs one at a time per ticket: triage, then wait for "resolved"."""
    ctx.step("triage", mark, ctx.run_id, "triage")
    ctx.set_progress(1, 2, "triaged")
    ctx.wait_for_signal("resolved")
    return ticket_id


def logs_a_warning(run_id):
    import logging

    logging.getLogger("tests.steps").warning("the courier is late")
    return "logged"


@durable.workflow("tests.traced")
def traced(ctx):
    """Two steps around a signal: its advances are taken by different workers (test_telemetry)."""
    ctx.step("before", mark, ctx.run_id, "before")
    ctx.wait_for_signal("go")
    return ctx.step("after", logs_a_warning, ctx.run_id)


async def fetch_async(run_id, name):
    import asyncio

    await asyncio.sleep(0.01)
    ledger.record(run_id, name)
    return f"fetched {name}"


async def slow_async(run_id, seconds):
    """Records that it started and, however it ends (cancelled too), that its cleanup ran."""
    import asyncio

    ledger.record(run_id, "slow-started")
    try:
        await asyncio.sleep(seconds)
    finally:
        ledger.record(run_id, "slow-cleaned-up")
    return "slept"


async def pay_async(run_id, amount):
    payment = await Payment.objects.acreate(run_id=run_id, amount=amount)  # Django's async ORM
    return payment.amount


@durable.workflow("tests.async_flow")
async def async_flow(ctx, amount=7):
    """An async workflow: awaits async steps, waits for a signal, ends with a sync step."""
    fetched = await ctx.astep("fetch", fetch_async, ctx.run_id, "fetch")
    paid = ctx.step("pay", pay_async, ctx.run_id, amount)
    ctx.wait_for_signal("go")
    ctx.step("after", mark, ctx.run_id, "after")
    return [fetched, paid]


@durable.workflow("tests.async_timeout")
def async_timeout(ctx, seconds=30):
    return ctx.step("slow", slow_async, ctx.run_id, seconds, timeout=0.2,
                    retry=durable.RetryPolicy(max_attempts=1))


@durable.workflow("tests.async_awaits_io")
async def async_awaits_io(ctx):
    import asyncio

    await asyncio.sleep(0)  # I/O in the workflow's own code: refused
    return "never"


def fails_on_the_first_run_attempt(attempt):
    if attempt == 1:
        raise durable.NonRetryableError("the run's first attempt fails")
    return attempt


@durable.workflow("tests.fails_once_as_a_run", max_attempts=2,
                  retry=durable.RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=0))
def fails_once_as_a_run(ctx):
    """Fails as a whole run once (retried from its checkpoint), then completes (test_contract)."""
    return ctx.step("flaky", fails_on_the_first_run_attempt, ctx.attempt)


if os.environ.get("DURABLE_TEST_AGENTS"):
    # The agents' workflows (tests/test_pydantic_ai.py, tests/test_openai_agents.py) only where a
    # test asks for them: importing pydantic-ai takes about 2 s, which every other worker process
    # would pay.
    from . import agents  # noqa: F401
    if os.environ["DURABLE_TEST_AGENTS"] == "openai":
        from . import openai_agents  # noqa: F401
