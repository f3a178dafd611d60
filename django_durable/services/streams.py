"""What a run says while it goes on, for a reader outside it: its streams (ctx.write_stream(),
durable.read_stream()) and its live events (GET /api/durable/workflows/{id}/stream/, server-sent).

Both read the run's journal, where every stream value, note and finished step is an entry with a
sequence number, and wait between reads for a NOTIFY on PostgreSQL (a stream value announces its
run on ``durable_stream``, a run's end on ``durable_done`` once someone waits for it) or, elsewhere
and as a safety net, a short poll.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db import connections

from .. import conf, serialization
from ..exceptions import WaitTimeout
from ..models import Step, WorkflowRun
from ..ids import check_name, run_pk
from ..workpool import listening, queries

POLL_SECONDS = 0.5  # between reads when no NOTIFY says more
KEEPALIVE_SECONDS = 15.0  # an SSE comment so that proxies keep the connection
# The journal entries the live events show, and what each is called there.
SHOWN = {"step": "step", "child": "step", "rollback": "step", "emit": "emit", "log": "note", "stream": "stream"}
FINAL = ("completed", "failed")


@dataclass(frozen=True)
class AbandonedValues:
    """What durable.read_stream() gives when a step that wrote to the stream while it ran
    (StepInfo.write_stream) runs again: the last `values` values it gave from that step came from
    an attempt that did not finish (`attempt` of the step, in the run's `delivery`). The values
    after this are the next attempt's."""

    step: str
    attempt: int | None
    delivery: int | None
    values: int


def read_stream(run_id, name: str, *, timeout: float | None = None) -> Iterator[Any]:
    """The values the run writes to its stream `name` (ctx.write_stream(), and a step's
    durable.current_step().write_stream()), in order, as they come.

    When a step that wrote values while it ran runs again, an AbandonedValues comes before the
    new attempt's values: how many of the values given were that unfinished attempt's. Ends after
    the stream is closed (ctx.close_stream()) or the run has ended and every value was given.
    Raise WaitTimeout when no value comes for `timeout` seconds (None: wait as long as the run
    goes on), WorkflowNotFound for an unknown run.
    """
    check_name(name, "stream")
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    if not WorkflowRun.objects.using(db).filter(pk=pk).exists():
        from ..exceptions import WorkflowNotFound

        raise WorkflowNotFound(f"No workflow run {pk}.")
    seen = 0
    with Listener(db, pk) as listener:
        waited_since = time.monotonic()
        while True:
            rows = list(Step.objects.using(db).filter(run_id=pk, kind="stream", name=name, seq__gt=seen)
                        .order_by("seq").values_list("seq", "result")[:500])
            for seq, text in rows:
                seen = seq
                body = serialization.decode(text)
                if body.get("closed"):
                    return
                abandoned = body.get("abandoned")
                if abandoned is not None:
                    yield AbandonedValues(abandoned["step"], abandoned.get("attempt"), abandoned.get("delivery"),
                                          abandoned["values"])
                    continue
                yield body.get("value")
            if rows:
                waited_since = time.monotonic()
                continue
            if _ended(pk, db) and not Step.objects.using(db).filter(
                    run_id=pk, kind="stream", name=name, seq__gt=seen).exists():
                return
            if timeout is not None and time.monotonic() - waited_since >= timeout:
                raise WaitTimeout(f"Run {pk} wrote nothing to the stream {name!r} for {timeout:g} s.", run_id=pk)
            left = None if timeout is None else timeout - (time.monotonic() - waited_since)
            listener.wait(POLL_SECONDS if left is None else max(0.0, min(POLL_SECONDS, left)))


class Follower:
    """The run's live events, one look at a time: `look()` reads the run and its journal once and
    returns the frames that are new, `done` once the run has ended (or is gone). What to send is
    decided here once; events() and aevents() only differ in how they wait between looks."""

    def __init__(self, run_id, *, payloads: bool, after: int = 0):
        self.pk, self.db, self.payloads = run_pk(run_id), conf.get("DATABASE"), payloads
        self.cursor, self.sent, self.status, self.done, self.more = after, set(), None, False, False

    def look(self) -> list[str]:
        frames = []
        # The run first: if it has ended, every entry it wrote is in the read that follows.
        run = WorkflowRun.objects.using(self.db).filter(pk=self.pk).values(
            "status", "waiting_on", "result", "error").first()
        if run is None:
            self.done = True
            return [_frame("end", {"status": "deleted"})]
        ended = run["status"] in WorkflowRun.TERMINAL
        pending = False
        rows = list(Step.objects.using(self.db).filter(run_id=self.pk, seq__gt=self.cursor, kind__in=list(SHOWN))
                    .order_by("seq").values_list("seq", "key", "kind", "name", "status", "result")[:500])
        for seq, key, kind, name, status, result in rows:
            if status not in FINAL and not ended:
                pending = True  # later entries may be sent; the cursor waits for this one
                continue
            if seq not in self.sent and status in FINAL:
                self.sent.add(seq)
                frames.append(_frame(SHOWN[kind], _event_data(seq, key, kind, name, status, result, self.payloads),
                                     self.cursor if pending else seq))
            if not pending:
                self.cursor = seq
        self.more = len(rows) == 500  # look again at once
        self.sent = {seq for seq in self.sent if seq > self.cursor}
        progress = Step.objects.using(self.db).filter(run_id=self.pk, key="progress").values_list(
            "result", flat=True).first()
        status = (run["status"], run["waiting_on"], progress)
        if status != self.status:
            self.status = status
            frames.append(_frame("status", {"status": run["status"], "waiting_on": run["waiting_on"],
                                            "progress": _progress(progress)}))
        if ended and not self.more:
            frames.append(_frame("end", _end(run, self.payloads)))
            self.done = True
        return frames


def events(run_id, *, payloads: bool, after: int = 0, max_seconds: float = 300.0) -> Iterator[str]:
    """The run's live events as server-sent event frames (text), until it ends or `max_seconds`.

    ``status`` (its status, what it waits on, its progress) at the start and on every change;
    ``step`` (a step, child or compensation finished: key, kind, status), ``note``, ``emit`` and
    ``stream`` (a value written to one of its streams) as the journal records them, each with the
    journal's sequence number as its id; ``end`` (its status, and its result or error message) when
    it ends. A reconnect with ``Last-Event-ID`` (`after`) goes on after that id: an event is given
    at least once (an entry finished out of order, a parallel branch, may come again). Values,
    results and notes' data only with `payloads` (the user may see them). For a WSGI server: it
    waits in its thread (aevents() is the same for an ASGI server).
    """
    follower = Follower(run_id, payloads=payloads, after=after)
    yield "retry: 1000\n\n"  # the browser reconnects after a second, with Last-Event-ID
    started = last_frame = time.monotonic()
    with Listener(follower.db, follower.pk, ends=True) as listener:
        while True:
            frames = follower.look()
            yield from frames
            if frames:
                last_frame = time.monotonic()
            if follower.done or time.monotonic() - started >= max_seconds:
                return  # (after max_seconds the browser reconnects, from the last id)
            if follower.more:
                continue
            if time.monotonic() - last_frame >= KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                last_frame = time.monotonic()
            listener.wait(POLL_SECONDS)


async def aevents(run_id, *, payloads: bool, after: int = 0, max_seconds: float = 300.0):
    """events() for an ASGI server, as an async iterator: each look at the database in the
    request's own thread (as Django's async ORM does it), and the wait between looks on the event
    loop, woken by LISTEN through psycopg's async connection on PostgreSQL."""
    from asgiref.sync import sync_to_async

    follower = Follower(run_id, payloads=payloads, after=after)
    look = sync_to_async(follower.look)
    yield "retry: 1000\n\n"
    started = last_frame = time.monotonic()
    listener = AsyncListener(follower.db, follower.pk)
    try:
        await listener.listen()
        while True:
            frames = await look()
            for frame in frames:
                yield frame
            if frames:
                last_frame = time.monotonic()
            if follower.done or time.monotonic() - started >= max_seconds:
                return
            if follower.more:
                continue
            if time.monotonic() - last_frame >= KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                last_frame = time.monotonic()
            await listener.wait(POLL_SECONDS)
    finally:
        await listener.close()
        await sync_to_async(connections.close_all)()  # the connections this stream's thread opened


def _frame(event: str, data: dict, id: int | None = None) -> str:
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def _event_data(seq, key, kind, name, status, result, payloads: bool) -> dict:
    data = {"seq": seq, "key": key}
    if kind == "stream":
        body = serialization.decode(result) or {}
        data.update(name=name, closed=bool(body.get("closed")))
        if "abandoned" in body:
            data["abandoned"] = body["abandoned"]  # the step's unfinished attempt: its values are void
        elif "step" in body:  # written by a step while it ran
            data.update(step=body["step"], attempt=body.get("attempt"), delivery=body.get("delivery"))
        if payloads and not body.get("closed") and "abandoned" not in body:
            data["value"] = body.get("value")
    elif kind == "log":
        body = serialization.decode(result) or {}
        data["message"] = body.get("message", "")
        if payloads:
            data["data"] = body.get("data") or {}
    elif kind == "emit":
        data["name"] = name
    else:
        data.update(kind=kind, status=status)
    return data


def _progress(text: str | None) -> dict | None:
    if not text:
        return None
    body = serialization.decode(text) or {}
    return {"done": body.get("done"), "total": body.get("total"), "message": body.get("message", "")}


def _end(run: dict, payloads: bool) -> dict:
    data = {"status": run["status"]}
    if payloads and run["result"] is not None:
        data["result"] = serialization.display(run["result"])
    if payloads and run["error"]:
        error = serialization.decode(run["error"]) or {}
        data["error"] = {"type": error.get("type", ""), "message": error.get("message", "")}
    return data


def _ended(pk, db) -> bool:
    return WorkflowRun.objects.using(db).filter(pk=pk, status__in=WorkflowRun.TERMINAL).exists()


def _channels(db: str, pk, ends: bool) -> list[str]:
    """The channels to LISTEN on for run `pk`; with `ends`, its end too, which is announced once
    someone waits for it (the mark durable.wait() sets)."""
    if not ends:
        return [queries.STREAM_CHANNEL]
    WorkflowRun.objects.using(db).filter(pk=pk).update(awaited=True)
    return [queries.STREAM_CHANNEL, queries.DONE_CHANNEL]


class Listener:
    """Waits for a NOTIFY about run `pk` (a stream value; its end, with `ends`) on PostgreSQL, or
    for the timeout; elsewhere, or when LISTEN fails, it only sleeps: the reads poll."""

    def __init__(self, db: str, pk, *, ends: bool = False):
        self.db, self.pk, self.ends, self.session = db, str(pk), ends, None

    def __enter__(self) -> Listener:
        try:
            if conf.listens(self.db):
                self.session = listening.session(self.db, _channels(self.db, self.pk, self.ends))
        except Exception:  # noqa: BLE001 - the reads poll without it
            self.close()
        return self

    def wait(self, seconds: float) -> None:
        if self.session is None:
            time.sleep(seconds)
            return
        try:
            listening.heard(self.session, self.pk, seconds)
        except Exception:  # noqa: BLE001 - a lost session: poll from now on
            self.close()

    def close(self) -> None:
        if self.session is not None:
            try:
                self.session.close()
            except Exception:  # noqa: BLE001
                pass
            self.session = None

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncListener:
    """Listener for the event loop: psycopg's async connection, asyncio.sleep without one."""

    def __init__(self, db: str, pk):
        self.db, self.pk, self.session = db, str(pk), None

    async def listen(self) -> None:
        from asgiref.sync import sync_to_async

        try:
            if await sync_to_async(conf.listens)(self.db):
                channels = await sync_to_async(_channels)(self.db, self.pk, True)
                self.session = await listening.asession(self.db, channels)
        except Exception:  # noqa: BLE001 - the looks poll without it
            await self.close()

    async def wait(self, seconds: float) -> None:
        import asyncio

        if self.session is None:
            await asyncio.sleep(seconds)
            return
        try:
            await listening.aheard(self.session, self.pk, seconds)
        except Exception:  # noqa: BLE001 - a lost session: poll from now on
            await self.close()

    async def close(self) -> None:
        if self.session is not None:
            try:
                await self.session.close()
            except Exception:  # noqa: BLE001
                pass
            self.session = None
