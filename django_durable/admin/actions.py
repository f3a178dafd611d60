"""The operator actions on a run: permission, form and service of each, and how the list reports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import services
from ..services.repairs import reason_of  # noqa: F401 - the list's bulk actions count their skips with it
from ..exceptions import InvalidTransition
from . import forms

BULK_LIMIT = 1000  # runs one bulk action handles at a time


@dataclass(frozen=True)
class RunAction:
    """An operator action on one run: its permission, its form, the service it calls, its wording."""

    name: str
    title: str
    permission: str
    form: type
    perform: Callable  # (run, cleaned_data, by) -> str: what was done
    explain: str = ""
    destructive: bool = False


def _cancel(run, data, by):
    services.cancel(run.pk, data.get("reason") or None, by=by)
    return "Cancel requested" + (f": {data['reason']}" if data.get("reason") else "")


def _retry(run, data, by):
    services.retry_run(run.pk, by=by)
    return "Retried from the last checkpoint"


def _force_fail(run, data, by):
    services.force_fail(run.pk, data.get("reason") or None, by=by)
    return "Forced to fail" + (f": {data['reason']}" if data.get("reason") else "")


def _retry_rollback(run, data, by):
    services.retry_rollback(run.pk, by=by)
    return "Rollback retried"


def _skip(run, data, by):
    services.skip_step(run.pk, data["key"], data["result"], by=by)
    return f"Skipped step {data['key']!r}"


def _edit(run, data, by):
    services.edit_step_result(run.pk, data["key"], data["result"], by=by)
    return f"Edited the result of step {data['key']!r}"


def _signal(run, data, by):
    services.signal(run.pk, data["name"], data["payload"], idempotency_key=data.get("idempotency_key") or None, by=by)
    return f"Sent signal {data['name']!r}"


def _wake(run, data, by):
    fired = services.wake(run.pk, data.get("timer"), by=by)
    return f"Fired {fired} timer(s) early"


def _recover(run, data, by):
    if not services.recover([run.pk], by=by):
        raise InvalidTransition(f"Workflow run {run.pk} is not stuck: something will advance it.")
    return "Gave its advance back"


def _duplicate(run, data, by):
    copy = services.duplicate(run.pk, by=by)
    return f"Duplicated as run {copy.pk}"


def _fork(run, data, by):
    fork = services.fork(run.pk, from_step=data["from_step"], by=by)
    return f"Forked at step {data['from_step']!r} as run {fork.pk}"


ACTIONS = {
    action.name: action
    for action in [
        RunAction("cancel", "Cancel", "cancel_workflowrun", forms.ReasonForm, _cancel, destructive=True,
                  explain="A waiting or pending run ends cancelled now; a running one stops at its next checkpoint, "
                          "its step interrupted after a grace period. Its unfinished children are cancelled too."),
        RunAction("retry", "Retry from the last checkpoint", "retry_workflowrun", forms.NoForm, _retry,
                  explain="Completed steps keep their results and do not run again; the failed step and those "
                          "after it run with fresh attempts."),
        RunAction("force-fail", "Force fail", "forcefail_workflowrun", forms.ReasonForm, _force_fail,
                  destructive=True,
                  explain="The run ends failed now, without compensation. A worker running it loses its claim; "
                          "the step in progress may have had effects that are not recorded."),
        RunAction("retry-rollback", "Retry the rollback", "retryrollback_workflowrun", forms.NoForm,
                  _retry_rollback, explain="The compensations that failed run again; those that completed do not."),
        RunAction("skip-step", "Skip a step", "skipstep_workflowrun", forms.StepForm, _skip, destructive=True,
                  explain="The step's function is not called again: the workflow receives the result you give. "
                          "A failed run goes on from its last checkpoint."),
        RunAction("edit-step", "Edit a step's result", "editstep_workflowrun", forms.StepForm, _edit,
                  destructive=True,
                  explain="Later replays of the run see the new result; steps that already used the old one "
                          "do not run again."),
        RunAction("signal", "Send a signal", "signal_workflowrun", forms.SignalForm, _signal,
                  explain="The run takes it with ctx.wait_for_signal(name), now or later."),
        RunAction("wake", "Wake now", "wake_workflowrun", forms.WakeForm, _wake,
                  explain="Sleeps, back-offs and a delayed start end now. A named timeout or deadline fires too, "
                          "which times its wait or the run out."),
        RunAction("recover", "Recover", "retry_workflowrun", forms.NoForm, _recover,
                  explain="For a run nothing will advance (no work queued, no timer, no wait from outside, no "
                          "child running): its advance is given back, and a worker replays it from the journal."),
        RunAction("duplicate", "Duplicate", "start_workflowrun", forms.NoForm, _duplicate,
                  explain="Starts a new run of the same workflow with the same input, queue and priority."),
        RunAction("fork", "Fork from a step", "start_workflowrun", forms.ForkForm, _fork,
                  explain="Starts a new run of the same workflow and input whose journal is this run's up to the "
                          "step you choose: the steps before it are copied, not run again; it and those after it "
                          "run on the code installed now (after a fix, say). The new run links back to this one."),
    ]
}

# The bulk actions of the list: (action, verb for the message).
BULK = {"cancel": "Cancelled", "retry": "Retried", "force-fail": "Forced to fail",
        "retry-rollback": "Retried the rollback of", "wake": "Woke", "recover": "Recovered",
        "duplicate": "Duplicated"}
