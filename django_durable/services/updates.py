"""Updates: ask a running workflow and get its answer (durable.update(), ctx.wait_for_update()).

The request is a signal to the run named ``update:<name>``, carrying an id of its own and the
payload, sent with that id as its idempotency key; the workflow takes it with
ctx.wait_for_update(name) and answers with update.answer(value) (or update.reject(reason)), a
journal entry ``update-answer:<id>`` written at once. The caller waits for that entry. Both halves
are durable: a request sent is kept until the run takes it, a run that took it and lost its worker
takes it again from its journal on replay, and an answer recorded is never recorded again.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from .. import conf, serialization
from ..engine.waits import ANSWER_PREFIX, UPDATE_PREFIX
from ..exceptions import RunFinished, UpdateRejected, WaitTimeout
from ..models import Step, WorkflowRun
from ..ids import check_name
from .messages import signal
from ..ids import run_pk

FIRST_PAUSE, LONGEST_PAUSE = 0.005, 0.25


def update(run_id, name: str, payload: Any = None, *, timeout: float | None = 30.0, by: str | None = None) -> Any:
    """Send the update `name` with `payload` to a run and return the workflow's answer.

    Waits up to `timeout` seconds (None: without end) for the run to take it with
    ctx.wait_for_update(name) and answer. Raise UpdateRejected if the workflow refused it,
    WaitTimeout if no answer came in time (the request stays queued: the run may answer it later,
    see answer_of() with the id in the exception's `update_id`), RunFinished if the run ended
    (before or after taking it) without answering, WorkflowNotFound for an unknown run.
    """
    update_id = send(run_id, name, payload, by=by)
    return answer_of(run_id, update_id, timeout=timeout, name=name)


def send(run_id, name: str, payload: Any = None, *, by: str | None = None) -> str:
    """Queue the update without waiting for its answer; return its id (for answer_of())."""
    check_name(name, "update")
    update_id = str(uuid.uuid4())
    signal(run_id, f"{UPDATE_PREFIX}{name}", {"id": update_id, "payload": payload},
           idempotency_key=f"{UPDATE_PREFIX}{update_id}", by=by)
    return update_id


def answer_of(run_id, update_id: str, *, timeout: float | None = 0.0, name: str = "") -> Any:
    """The answer to the update `update_id` of the run, waiting up to `timeout` seconds for it
    (0: look once); raise as update() does."""
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    key = f"{ANSWER_PREFIX}{update_id}"
    deadline = None if timeout is None else time.monotonic() + max(0.0, float(timeout))
    pause = FIRST_PAUSE
    while True:
        text = Step.objects.using(db).filter(run_id=pk, key=key).values_list("result", flat=True).first()
        if text is not None:
            answer = serialization.decode(text)
            if "rejected" in answer:
                raise UpdateRejected(f"Run {pk} refused the update{f' {name!r}' if name else ''}: "
                                     f"{answer['rejected'] or 'no reason given'}.", answer["rejected"], update_id)
            return answer.get("answer")
        status = WorkflowRun.objects.using(db).filter(pk=pk).values_list("status", flat=True).first()
        if status in WorkflowRun.TERMINAL:
            # It may have answered just before it ended: look once more, after the status.
            if not Step.objects.using(db).filter(run_id=pk, key=key).exists():
                raise RunFinished(pk, status)
            continue
        if deadline is not None and time.monotonic() >= deadline:
            error = WaitTimeout(f"Run {pk} did not answer the update{f' {name!r}' if name else ''} in time "
                                f"(it stays queued; its id is {update_id}).", run_id=pk)
            error.update_id = update_id
            raise error
        time.sleep(pause if deadline is None else max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(pause * 1.5, LONGEST_PAUSE)
