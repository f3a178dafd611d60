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
