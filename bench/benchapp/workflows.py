"""The benchmark workflows: trivial steps, so the engine's own cost is what gets measured."""

import django_durable as durable


def noop(i):
    return i


@durable.workflow("bench.ten_steps")
def ten_steps(ctx, n=10):
    for i in range(n):
        ctx.step(f"s{i}", noop, i)
    return n


@durable.workflow("bench.one_step")
def one_step(ctx):
    return ctx.step("only", noop, 1)


@durable.workflow("bench.sleep_until")
def sleep_until(ctx, at):
    ctx.sleep_until("nap", at)
    return ctx.step("after", noop, 1)


@durable.workflow("bench.wait_signal")
def wait_signal(ctx):
    ping = ctx.wait_for_signal("ping")
    return ctx.step("pong", noop, ping)


@durable.workflow("bench.fanout")
def fanout(ctx, n):
    return len(ctx.map("items", noop, range(n)))


def big_value(mb: int, keep: bool):
    """About `mb` MB of JSON in distinct strings (more in memory); its length, or itself when `keep`."""
    value = [f"{i:010d}" + "x" * 89 for i in range(mb * 10_000)]
    return value if keep else len(value)


@durable.workflow("bench.big_result")
def big_result(ctx, mb, keep=True, reread=False):
    """With `reread`, the run sleeps after the step: the next advance replays it, and the value
    comes back from where it was stored."""
    value = ctx.step("big", big_value, mb, keep)
    if reread:
        ctx.sleep("pause", 0.1)
    return len(value) if keep else value
