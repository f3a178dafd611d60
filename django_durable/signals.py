"""Django signals for run and step events, sent after the change they announce has committed.

The sender is the workflow function, so a receiver can listen to one workflow:
``run_completed.connect(handler, sender=fulfil)``; every signal also passes the workflow's name
as ``workflow``. Receivers run in the worker process; an exception in a receiver is logged and
does not affect the run.

- ``run_started(run_id, workflow)``: a worker began the run's first advance.
- ``run_completed(run_id, workflow, result)``: the run returned.
- ``run_failed(run_id, workflow, status, error)``: the run ended ``failed`` or ``timed_out``.
- ``run_cancelled(run_id, workflow)``: the run ended ``cancelled``.
- ``run_blocked(run_id, workflow, reason)``: a replay found the workflow code no longer matches
  the run's journal (a NonDeterminismError); the run is held, ``blocked``, for an operator.
- ``run_paused(run_id, workflow, key, error)``: a step failed for good under a policy that pauses
  (``RetryPolicy(on_exhausted="pause")``); the run is held, ``paused``, for an operator.
- ``step_completed(run_id, workflow, key, result, attempts)``: a step's result was recorded.
- ``step_failed(run_id, workflow, key, error, attempt, will_retry)``: an attempt failed;
  ``will_retry`` is False when the step failed for good.
- ``run_noted(run_id, workflow, key, message, data)``: the workflow added a note (``ctx.note()``).
- ``run_progress(run_id, workflow, done, total, message)``: the workflow set its progress
  (``ctx.set_progress()``).
- ``run_emitted(run_id, workflow, name, payload, delivered)``: the workflow emitted an event
  (``ctx.emit()``); ``delivered`` is how many waiting runs took it.

Each is sent once, after the change it announces committed; a replay of the workflow code does
not send it again (a worker that dies between the commit and the signal does not send it at all).
"""

import logging

from django.dispatch import Signal

from .registry import sender_of

logger = logging.getLogger("django_durable")

run_started = Signal()
run_completed = Signal()
run_failed = Signal()
run_cancelled = Signal()
run_blocked = Signal()
run_paused = Signal()
step_completed = Signal()
step_failed = Signal()
run_noted = Signal()
run_progress = Signal()
run_emitted = Signal()


def listened(signal: Signal, workflow: str) -> bool:
    """Whether `signal` has receivers for `workflow`: check before decoding what it would carry."""
    # No receiver at all, the common case, is one test (a worker sends a signal or two a run).
    return bool(signal.receivers) and signal.has_listeners(sender_of(workflow))


def send(signal: Signal, workflow: str, **kwargs) -> None:
    """Send `signal` for the workflow named `workflow`; log, never raise, what a receiver raises."""
    if not listened(signal, workflow):
        return
    for receiver, response in signal.send_robust(sender=sender_of(workflow), workflow=workflow, **kwargs):
        if isinstance(response, Exception):
            logger.error("Receiver %r of a django-durable signal raised %r.", receiver, response,
                         exc_info=(type(response), response, response.__traceback__))
