"""``async def`` workflows and steps.

An async step (``ctx.step("fetch", fetch, url)`` with ``async def fetch``) runs to completion on an
event loop of its own in the worker's thread; Django's async ORM (``await Order.objects.aget()``)
and ``sync_to_async`` work inside it as Django expects. Its timeout is ``asyncio.wait_for``: past
the deadline the step's task is cancelled (``CancelledError`` at its ``await``, so its ``finally``
blocks and ``async with`` exits run) and the attempt fails with StepTimeout.

An async workflow (``async def fulfil(ctx, ...)``) is driven by the engine like a coroutine that
never needs the loop: the context's methods never block (a wait suspends the run, it does not
sleep), so its code calls them as it would in a sync workflow, or awaits ``ctx.astep()``. Awaiting
anything else in the workflow's own body (``asyncio.sleep``, an HTTP client) would be I/O outside
a step, which a replay would repeat: it fails the run with a TypeError that says so.
"""

from __future__ import annotations

import asyncio
import inspect
import types
import weakref
from typing import Any

from ..exceptions import StepTimeout


_known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # fn -> is_async(fn), asked each step
_COROUTINE = types.CoroutineType  # inspect.iscoroutine() without its call, at every step and task


def is_async(fn) -> bool:
    try:
        return _known[fn]
    except (KeyError, TypeError):  # not asked yet, or a callable that takes no weak reference
        pass
    answer = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
    try:
        _known[fn] = answer
    except TypeError:
        pass
    return answer


def call_workflow(fn, context, args, kwargs) -> Any:
    """Call a workflow function (sync or async) with its context; return what it returned."""
    value = fn(context, *args, **kwargs)
    if not isinstance(value, _COROUTINE):
        return value
    return drive(value, getattr(fn, "__qualname__", "the workflow"))


def drive(coroutine, name: str) -> Any:
    """Run a workflow's coroutine, which must never wait for the loop; return its value."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return done.value
    coroutine.close()
    raise TypeError(
        f"{name} awaited something other than the context's methods in the workflow's own code. An "
        f"async workflow may only await ctx.astep() (and call the other ctx methods); do I/O, "
        f"asyncio.sleep() and other awaits inside a step, whose result is recorded."
    )


def settled(value, deadline, claim, key: str) -> Any:
    """What a step's function returned: as it is, or, for a coroutine (an async step), its value
    once run to its end, cancelled at `deadline` (the database's clock, through `claim`)."""
    if not isinstance(value, _COROUTINE):
        return value
    return run_step(value, None if deadline is None else claim.db_seconds_until(deadline), key)


def run_step(value, timeout: float | None, key: str) -> Any:
    """Run an async step's coroutine `value` to its end, cancelled after `timeout` seconds."""

    async def bounded():
        if timeout is None:
            return await value
        try:
            return await asyncio.wait_for(value, max(timeout, 0.0))
        except TimeoutError:
            raise StepTimeout(f"Step {key!r} ran past its deadline; its task was cancelled.") from None

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(bounded())
    value.close()
    raise RuntimeError(
        f"Step {key!r} is async, but its workflow runs inside an event loop already (drain() called "
        f"from async code?). Run the worker, or drain() from sync code."
    )
