"""Values a step writes to its run's streams while it runs: ``durable.current_step().write_stream()``.

A workflow's own ``ctx.write_stream()`` is replayed like every call of the workflow code: written
once, whatever happens. Step code is different: a step that fails (or whose worker dies) runs
again, and what its earlier attempt wrote has been read already. So each value a step writes is a
journal entry of its own, committed at once (fenced by the run's claim: a worker that lost its
claim writes nothing), tagged with the step and its attempt; and before a step's later attempt
starts, each stream an earlier attempt wrote to gets a marker saying that attempt was abandoned
and how many of its values to disregard. Readers see the values as they come, then the marker,
then the new attempt's values; nothing is taken back or written twice.

The entries' keys are ``live:<step>:<writer>:<n>`` (`<step>` a digest of the step's key, `<writer>`
one attempt's own random name) and ``live:<step>:<writer>:end<i>`` for its markers: no workflow
code reaches them, so every replay counts them as reached (`Index.reached`).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connections

from .. import conf, serialization
from ..ids import check_name

PREFIX = "live:"
REACHED = "a value a step wrote while it ran"


def step_digest(key: str) -> str:
    return hashlib.blake2b(key.encode(), digest_size=5).hexdigest()


class Index:
    """The live entries of a run's journal, by step digest and writer: what a later attempt of
    the step must mark abandoned. Built once an advance from the journal's keys."""

    def __init__(self, journal: dict) -> None:
        self.lock = threading.Lock()  # a step's writes, from whichever thread its code writes in
        # digest -> writer -> {"first": a value's key, "names": {stream: count}, "ended": marked}
        self.writers: dict[str, dict[str, dict]] = {}
        self.reached: list[str] = []
        for key, entry in journal.items():
            if key.startswith(PREFIX):
                self.reached.append(key)
                _, digest, writer, n = key.split(":", 3)
                info = self.writer(digest, writer)
                if n.startswith("end"):
                    info["ended"] = True
                else:
                    info["first"] = info["first"] or key
                    info["names"][entry.name] = info["names"].get(entry.name, 0) + 1

    def writer(self, digest: str, writer: str) -> dict:
        return self.writers.setdefault(digest, {}).setdefault(writer, {"first": None, "names": {}, "ended": False})


class StepStreams:
    """One attempt of one step, as a writer to its run's streams (StepInfo.write_stream)."""

    __slots__ = ("context", "key", "attempt", "writer", "count", "apart")

    def __init__(self, context, key: str, attempt: int) -> None:
        self.context, self.key, self.attempt = context, key, attempt
        self.writer: str | None = None
        self.count = 0
        self.apart = False  # an async step wrote through _apart's thread

    def done(self) -> None:
        """The step's attempt has ended: close the connection its async writes used."""
        if self.apart:
            _executor().submit(connections.close_all).result()

    def write(self, name: str, value: Any) -> None:
        from ..workpool.wakeups import announce_stream

        check_name(name, "stream")
        context = self.context
        claim = context._session.claim
        body = {"value": value, "step": self.key, "attempt": self.attempt, "delivery": claim.attempts}
        text = serialization.encode(body, what=f"a value of the stream {name!r}", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
        index = context._live
        with index.lock:  # a value's seq is taken and committed in one go: readers never skip one
            if self.writer is None:  # this attempt's first value: its name in the keys
                self.writer = f"{step_digest(self.key)}:{secrets.token_hex(4)}"
            info = index.writer(*self.writer.split(":"))
            key = f"{PREFIX}{self.writer}:{self.count}"
            context._record(key, name, "completed", text, None, context._session.now(), 1, kind="stream", write="now")
            self.count += 1
            context._used[key] = REACHED
            info["first"] = info["first"] or key
            info["names"][name] = info["names"].get(name, 0) + 1
        announce_stream(claim.run_id, db=claim.db)


_apart: ThreadPoolExecutor | None = None
_apart_lock = threading.Lock()


def _executor() -> ThreadPoolExecutor:
    global _apart
    with _apart_lock:
        if _apart is None:
            _apart = ThreadPoolExecutor(max_workers=1, thread_name_prefix="durable-stream")
        return _apart


async def awrite(streams: StepStreams | None, write, name: str, value: Any) -> None:
    """StepInfo.awrite_stream(): its `write` (write_stream) in a thread outside the step's event
    loop (Django refuses database calls on a thread that runs one), with the step's context
    variables; `streams` is told to close that thread's connection when the step ends."""
    if streams is not None:
        streams.apart = True
    context = contextvars.copy_context()
    await asyncio.get_running_loop().run_in_executor(_executor(), context.run, write, name, value)


def abandon_earlier(context, key: str) -> None:
    """Before an attempt of step `key` starts: mark what each earlier attempt wrote to a stream
    as abandoned (one marker a stream, written at once), unless it was marked before."""
    from ..workpool.wakeups import announce_stream

    digest = step_digest(key)
    earlier = context._live.writers.get(digest)
    if not earlier:
        return
    marked = False
    for writer, info in earlier.items():
        if info["ended"] or info["first"] is None:
            continue
        first = serialization.decode(context._journal[info["first"]].result) or {}
        for i, (name, count) in enumerate(sorted(info["names"].items())):
            body = {"abandoned": {"step": key, "attempt": first.get("attempt"), "delivery": first.get("delivery"),
                                  "values": count}}
            marker = f"{PREFIX}{digest}:{writer}:end{i}"
            context._record(marker, name, "completed", serialization.encode(body), None, context._session.now(), 1,
                            kind="stream", write="now")
            context._used[marker] = REACHED
        info["ended"] = marked = True
    if marked:
        announce_stream(context._session.claim.run_id, db=context._session.claim.db)
