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
from typing import Any

from django.db import connections

from .. import conf, serialization
from ..exceptions import WaitTimeout
from ..models import Step, WorkflowRun
from ..workpool import queries
from ..workpool.messages import check_name
from .runs import _run_pk

POLL_SECONDS = 0.5  # between reads when no NOTIFY says more
KEEPALIVE_SECONDS = 15.0  # an SSE comment so that proxies keep the connection
# The journal entries the live events show, and what each is called there.
SHOWN = {"step": "step", "child": "step", "rollback": "step", "emit": "emit", "log": "note", "stream": "stream"}
FINAL = ("completed", "failed")


def read_stream(run_id, name: str, *, timeout: float | None = None) -> Iterator[Any]:
    """The values the run writes to its stream `name` (ctx.write_stream()), in order, as they come.

    Ends after the stream is closed (ctx.close_stream()) or the run has ended and every value was
    given. Raise WaitTimeout when no value comes for `timeout` seconds (None: wait as long as the
    run goes on), WorkflowNotFound for an unknown run.
    """
    check_name(name, "stream")
    pk = _run_pk(run_id)
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


def events(run_id, *, payloads: bool, after: int = 0, max_seconds: float = 300.0) -> Iterator[str]:
    """The run's live events as server-sent event frames (text), until it ends or `max_seconds`.

    ``status`` (its status, what it waits on, its progress) at the start and on every change;
    ``step`` (a step, child or compensation finished: key, kind, status), ``note``, ``emit`` and
    ``stream`` (a value written to one of its streams) as the journal records them, each with the
    journal's sequence number as its id; ``end`` (its status, and its result or error message) when
    it ends. A reconnect with ``Last-Event-ID`` (`after`) goes on after that id: an event is given
    at least once (an entry finished out of order, a parallel branch, may come again). Values,
    results and notes' data only with `payloads` (the user may see them).
    """
    pk = _run_pk(run_id)
    db = conf.get("DATABASE")
    yield "retry: 1000\n\n"  # the browser reconnects after a second, with Last-Event-ID
    cursor, sent, last_status = after, set(), None
    started = last_frame = time.monotonic()
    with Listener(db, pk, ends=True) as listener:
        while True:
            # The run first: if it has ended, every entry it wrote is in the read that follows.
            run = WorkflowRun.objects.using(db).filter(pk=pk).values("status", "waiting_on", "result", "error").first()
            if run is None:
                yield _frame("end", {"status": "deleted"})
                return
            ended = run["status"] in WorkflowRun.TERMINAL
            pending, full = False, False
            rows = list(Step.objects.using(db).filter(run_id=pk, seq__gt=cursor, kind__in=list(SHOWN))
                        .order_by("seq").values_list("seq", "key", "kind", "name", "status", "result")[:500])
            for seq, key, kind, name, status, result in rows:
                if status not in FINAL and not ended:
                    pending = True  # later entries may be sent; the cursor waits for this one
                    continue
                if seq not in sent and status in FINAL:
                    sent.add(seq)
                    yield _frame(SHOWN[kind], _event_data(seq, key, kind, name, status, result, payloads),
                                 cursor if pending else seq)
                    last_frame = time.monotonic()
                if not pending:
                    cursor = seq
            full = len(rows) == 500
            sent = {seq for seq in sent if seq > cursor}
            progress = Step.objects.using(db).filter(run_id=pk, key="progress").values_list("result", flat=True).first()
            status = (run["status"], run["waiting_on"], progress)
            if status != last_status:
                last_status = status
                yield _frame("status", {"status": run["status"], "waiting_on": run["waiting_on"],
                                        "progress": _progress(progress)})
                last_frame = time.monotonic()
            if full:
                continue
            if ended:
                yield _frame("end", _end(run, payloads))
                return
            if time.monotonic() - started >= max_seconds:
                return  # the browser reconnects (retry), from the last id
            if time.monotonic() - last_frame >= KEEPALIVE_SECONDS:
                yield ": keepalive\n\n"
                last_frame = time.monotonic()
            listener.wait(POLL_SECONDS)


async def asynchronous(frames: Iterator[str]):
    """`frames` as an async iterator for an ASGI server: each next frame (its reads and its wait)
    in the request's own thread (Django's thread-sensitive context), so that the event loop never
    blocks, no frame is held back, and one database connection serves the whole stream."""
    from asgiref.sync import sync_to_async

    step = sync_to_async(_next)
    try:
        while (frame := await step(frames)) is not None:
            yield frame
    finally:
        await sync_to_async(_close)(frames)


def _next(frames: Iterator[str]) -> str | None:
    try:
        return next(frames)
    except StopIteration:
        return None


def _close(frames) -> None:
    frames.close()
    connections.close_all()  # the connections this stream's thread opened


def _frame(event: str, data: dict, id: int | None = None) -> str:
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n"


def _event_data(seq, key, kind, name, status, result, payloads: bool) -> dict:
    data = {"seq": seq, "key": key}
    if kind == "stream":
        body = serialization.decode(result) or {}
        data.update(name=name, closed=bool(body.get("closed")))
        if payloads and not body.get("closed"):
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


class Listener:
    """Waits for a NOTIFY about run `pk` (a stream value; its end, with `ends`) on PostgreSQL, or
    for the timeout; elsewhere, or when LISTEN fails, it only sleeps: the reads poll."""

    def __init__(self, db: str, pk, *, ends: bool = False):
        self.db, self.pk, self.ends, self.session = db, str(pk), ends, None

    def __enter__(self) -> Listener:
        if connections[self.db].vendor != "postgresql" or not conf.get("LISTEN_NOTIFY"):
            return self
        try:
            import psycopg

            params = connections[conf.get("LISTEN_DATABASE") or self.db].get_connection_params()
            params.pop("cursor_factory", None)
            self.session = psycopg.connect(**params, autocommit=True)
            self.session.execute(f"LISTEN {queries.STREAM_CHANNEL}")
            if self.ends:  # the run's end is announced once someone waits for it
                self.session.execute(f"LISTEN {queries.DONE_CHANNEL}")
                WorkflowRun.objects.using(self.db).filter(pk=self.pk).update(awaited=True)
        except Exception:  # noqa: BLE001 - the reads poll without it
            self.close()
        return self

    def wait(self, seconds: float) -> None:
        if self.session is None:
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        try:
            while (left := deadline - time.monotonic()) > 0:
                for notice in self.session.notifies(timeout=left, stop_after=1):
                    if notice.payload == self.pk:
                        return
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
