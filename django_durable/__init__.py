"""django-durable: durable workflows for Django, stored in the project's own database.

    import django_durable as durable

    @durable.workflow("orders.fulfil")
    def fulfil(ctx, order_id):
        order = ctx.step("load", load_order, order_id)
        ...

    run = durable.start(fulfil, order_id=42)
    durable.wait(run.id, timeout=30)
"""

from importlib import import_module

from . import startup

startup.hold_collector()  # in a worker's start, until its loop (startup.py)

from .engine.composition import Call, ChildHandle, StepInfo
from .engine.composition import get_current_step as current_step
from .engine.context import Context
from .exceptions import (
    ApprovalTimeout,
    Cancelled,
    ChildFailed,
    DurableError,
    ForcedFailure,
    InvalidArguments,
    InvalidInput,
    InvalidTransition,
    NoBranchMatched,
    NonDeterminismError,
    NonRetryableError,
    NotSerializable,
    OtherDatabase,
    PayloadTooLarge,
    RetryAfter,
    RunFinished,
    SignalTimeout,
    SingletonBusy,
    StepFailed,
    StepNotFound,
    StepTimeout,
    SubjectBusy,
    UpdateRejected,
    WaitTimeout,
    WorkflowFailed,
    WorkflowNotFound,
    WorkflowTimeout,
)
from .registry import workflow
from .retry import RetryPolicy

__all__ = [
    "AbandonedValues",
    "ApprovalTimeout",
    "Call",
    "Cancelled",
    "ChildFailed",
    "ChildHandle",
    "Context",
    "DurableError",
    "ForcedFailure",
    "InvalidArguments",
    "InvalidInput",
    "InvalidTransition",
    "NoBranchMatched",
    "NonDeterminismError",
    "NonRetryableError",
    "NotSerializable",
    "OtherDatabase",
    "PayloadTooLarge",
    "RetryAfter",
    "RetryPolicy",
    "RunFinished",
    "SignalTimeout",
    "SingletonBusy",
    "StepFailed",
    "StepInfo",
    "StepNotFound",
    "StepTimeout",
    "SubjectBusy",
    "UpdateRejected",
    "WaitTimeout",
    "WorkflowFailed",
    "WorkflowNotFound",
    "WorkflowTimeout",
    "approval_link",
    "approvals_for",
    "astart",
    "await_result",
    "cancel",
    "cancel_runs_on_delete",
    "clear_queue",
    "current_step",
    "decide",
    "duplicate",
    "edit_step_result",
    "emit_event",
    "describe",
    "ensure_schedule",
    "force_fail",
    "fork",
    "get_run",
    "pause_queue",
    "read_stream",
    "plan_repair",
    "recover",
    "release_claim",
    "repair",
    "resume_queue",
    "retry_rollback",
    "retry_run",
    "runs_for",
    "set_queue_limits",
    "signal",
    "skip_step",
    "start",
    "start_and_wait",
    "start_many",
    "start_run",
    "update",
    "wait",
    "wake",
    "workflow",
    "workflows",
]

# The service functions touch the models, which exist only once Django's apps are loaded;
# importing them lazily lets `import django_durable` work in settings and workflows.py.
_LAZY = {
    name: "services"
    for name in (
        "start", "start_many", "start_run", "wait", "start_and_wait", "get_run", "signal", "emit_event", "cancel", "retry_rollback",
        "retry_run", "force_fail", "fork", "skip_step", "edit_step_result", "wake", "duplicate", "release_claim", "recover",
        "runs_for", "astart", "await_result",
    )
}


_LAZY["ensure_schedule"] = "schedules"
_LAZY["describe"] = "engine.describe"
_LAZY["update"] = "services.updates"
_LAZY["read_stream"] = _LAZY["AbandonedValues"] = "services.streams"
_LAZY["workflows"] = "catalog"
_LAZY["plan_repair"] = _LAZY["repair"] = "services.repairs"
_LAZY.update(dict.fromkeys(("pause_queue", "resume_queue", "set_queue_limits", "clear_queue"), "services.queue_control"))
_LAZY["cancel_runs_on_delete"] = "subjects"
_LAZY.update(decide="services.approvals", approval_link="services.approvals", approvals_for="services.approvals")


def __getattr__(name):
    if name in _LAZY:
        value = globals()[name] = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
        return value  # kept: the next durable.start() finds it without this call
    if name in ("testing", "schedules"):
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
