"""The workflow registry: @durable.workflow and lookup by name. Nothing is imported from a name."""

from __future__ import annotations

import datetime as dt
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from .exceptions import InvalidArguments, WorkflowNotFound
from .retry import RetryPolicy

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")

_registry: dict[str, WorkflowDefinition] = {}


@dataclass(frozen=True)
class WorkflowDefinition:
    """A registered workflow: its name, its function and the defaults of its runs."""

    name: str
    fn: Callable
    queue: str = "default"
    priority: int = 0
    timeout: dt.timedelta | None = None
    max_attempts: int = 1
    retry: RetryPolicy | None = None
    compensate_on_failure: bool = False
    compensate_on_cancel: bool = False
    schedule: str | dict | None = None
    input: Any = None  # a DRF Serializer class, or a callable: validates a run's input (validated())
    one_at_a_time: bool = False  # at most one unfinished run per subject (start(..., subject=obj))
    retention: dt.timedelta | None = None  # how long its finished runs are kept; None: DURABLE_RETENTION
    singleton_busy: str = "return"  # start(..., singleton=key) while one is unfinished: "return" it, or "refuse"

    kind = "workflow"  # or "task": a django.tasks task (tasks.TaskDefinition)

    @property
    def qualified_name(self) -> str:
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def refused_result(self, exc: Exception) -> Exception:
        """The error a run whose return value cannot be stored fails with (a task's differs)."""
        return exc

    def ended(self, run_id, status: str, result: str | None, error: str | None) -> None:
        """Told of a run's end once it has committed, before the run's signals are sent: its
        status and its result or error as stored (JSON text). A workflow's does nothing; a task's
        sends django.tasks' task_finished."""

    @cached_property
    def _signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self.fn)
        except (TypeError, ValueError):  # a callable without one: nothing to check against
            return None

    def validated(self, args, kwargs: dict) -> tuple[list, dict]:
        """The arguments a run of this workflow is stored with: check_arguments(), then the
        workflow's declared `input` validation, whose cleaned values are stored (by name).

        `input` is a DRF Serializer class (its ``validated_data``), or a callable given the
        arguments by name that raises ValueError or a ValidationError for bad input and returns
        a dict of cleaned arguments or None (they are stored as given). Raise InvalidArguments,
        or InvalidInput with the errors by field.
        """
        self.check_arguments(args, kwargs)
        if self.input is None:
            return list(args), kwargs
        arguments = self._by_name(args, kwargs)
        if inspect.isclass(self.input):
            serializer = self.input(data=arguments)
            if not serializer.is_valid():
                raise _invalid(self.name, _flat(serializer.errors))
            return [], dict(serializer.validated_data)
        try:
            cleaned = self.input(**arguments)
        except Exception as exc:
            errors = _errors_of(exc)
            if errors is None:
                raise
            raise _invalid(self.name, errors) from None
        return ([], dict(cleaned)) if cleaned is not None else (list(args), kwargs)

    def _by_name(self, args, kwargs: dict) -> dict:
        """The arguments by parameter name (a **kwargs parameter's items among them)."""
        signature = self._signature
        if signature is None:
            return dict(kwargs)
        bound = signature.bind(None, *args, **kwargs)
        named = {}
        for index, (name, value) in enumerate(bound.arguments.items()):
            parameter = signature.parameters[name]
            if index == 0:
                continue  # the context
            if parameter.kind is parameter.VAR_KEYWORD:
                named.update(value)
            elif parameter.kind is parameter.VAR_POSITIONAL:
                named[name] = list(value)
            else:
                named[name] = value
        return named

    def check_arguments(self, args, kwargs: dict) -> None:
        """Raise InvalidArguments unless the function takes (ctx, *args, **kwargs).

        Called before a run is stored, so a misspelt keyword is refused at once instead of
        failing the run later on a worker.
        """
        signature = self._signature
        if signature is None:
            return
        try:
            signature.bind(None, *args, **kwargs)
        except TypeError as exc:
            parameters = list(signature.parameters.values())[1:]
            takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
            named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            unknown = [] if takes_any else [key for key in kwargs if key not in named]
            accepted = ", ".join(named) or "none"
            if unknown:
                raise InvalidArguments(
                    f"Workflow {self.name!r} takes no argument named {unknown[0]!r} (its arguments: {accepted}).",
                    argument=unknown[0],
                ) from None
            raise InvalidArguments(
                f"Workflow {self.name!r} cannot be started with these arguments: {exc} (its arguments: {accepted})."
            ) from None


def workflow(
    name: str | Callable | None = None,
    *,
    queue: str = "default",
    priority: int = 0,
    timeout: dt.timedelta | float | None = None,
    max_attempts: int = 1,
    retry: RetryPolicy | None = None,
    compensate_on_failure: bool = False,
    compensate_on_cancel: bool = False,
    schedule: str | dict | None = None,
    input: Any = None,
    one_at_a_time: bool = False,
    retention: dt.timedelta | float | None = None,
    singleton_busy: str = "return",
):
    """Register a function as a workflow and return it unchanged.

    Use as ``@durable.workflow("orders.fulfil")``; a bare ``@durable.workflow`` registers the
    function under its module and name. The function receives a Context first.

    `timeout` is an absolute deadline from each run's creation (the run ends ``timed_out``);
    `max_attempts` is how often a run whose function raises is tried again from its last
    checkpoint; `retry` is the default retry policy of its steps. With `compensate_on_failure`
    (`compensate_on_cancel`), a run that fails for good (is cancelled) first runs the
    compensations of its completed steps, as ctx.rollback() does. `schedule` (a cron
    expression, or a dict of ensure_schedule() options) declares a schedule named after the
    workflow, created by ``manage.py durable schedules sync`` and by every worker at start-up.
    `input` (a DRF Serializer class, or a callable) validates a run's input before anything is
    stored, wherever it is started from (WorkflowDefinition.validated()). With `one_at_a_time`,
    a run started for a subject (``start(..., subject=order)``) while another run of this
    workflow for the same subject is unfinished is refused (durable.SubjectBusy). `retention` (a
    timedelta or seconds) is how long its finished runs are kept before the prune deletes them,
    instead of DURABLE_RETENTION. `singleton_busy` says what ``start(..., singleton=key)`` does
    while a run of this workflow with that key is unfinished: "return" it (the default), or
    "refuse" (durable.SingletonBusy).
    """
    if callable(name):
        return workflow()(name)
    if singleton_busy not in ("return", "refuse"):
        raise ValueError(f"singleton_busy is 'return' or 'refuse', not {singleton_busy!r}.")

    def decorator(fn: Callable) -> Callable:
        definition = WorkflowDefinition(
            name=name or f"{fn.__module__}.{fn.__qualname__}",
            fn=fn,
            queue=queue,
            priority=priority,
            timeout=_timedelta(timeout, name or fn.__qualname__),
            max_attempts=max_attempts,
            retry=retry,
            compensate_on_failure=compensate_on_failure,
            compensate_on_cancel=compensate_on_cancel,
            schedule=schedule,
            input=input,
            one_at_a_time=bool(one_at_a_time),
            retention=_timedelta(retention, name or fn.__qualname__, "retention"),
            singleton_busy=singleton_busy,
        )
        register(definition)
        fn.durable_workflow = definition
        return fn

    return decorator


def _invalid(name: str, errors: dict[str, list[str]]):
    from .exceptions import InvalidInput

    shown = "; ".join(f"{field}: {' '.join(messages)}" for field, messages in errors.items())
    return InvalidInput(f"Workflow {name!r} refused its input: {shown}", errors)


def _flat(errors) -> dict[str, list[str]]:
    """A serializer's errors as {field: [message, ...]} (nested ones under dotted fields)."""
    flat = {}

    def walk(value, path):
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, f"{path}.{key}" if path else str(key))
        elif isinstance(value, list) and value and not all(isinstance(v, str) for v in value):
            for index, inner in enumerate(value):
                walk(inner, f"{path}.{index}")
        else:
            flat.setdefault(path or "input", []).extend(str(v) for v in (value if isinstance(value, list) else [value]))

    walk(errors, "")
    return flat


def _errors_of(exc: Exception) -> dict[str, list[str]] | None:
    """The errors by field a validating callable raised, or None if it raised something else."""
    from django.core.exceptions import ValidationError as DjangoValidationError

    if isinstance(exc, DjangoValidationError):
        if hasattr(exc, "error_dict"):
            return {field: [str(m) for error in errors for m in error.messages] for field, errors in exc.error_dict.items()}
        return {"input": list(exc.messages)}
    try:
        from rest_framework.exceptions import ValidationError as DRFValidationError
    except ImportError:  # pragma: no cover - djangorestframework is a dependency
        DRFValidationError = ()
    if isinstance(exc, DRFValidationError):
        return _flat(exc.detail)
    if isinstance(exc, ValueError):
        return {"input": [str(exc)]}
    return None


def _timedelta(value, name, option: str = "timeout") -> dt.timedelta | None:
    if value is None or isinstance(value, dt.timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return dt.timedelta(seconds=value)
    raise ImproperlyConfigured(f"Workflow {name!r} has {option}={value!r}; use seconds or a timedelta.")


def register(definition: WorkflowDefinition) -> None:
    """Add `definition` to the registry; raise ImproperlyConfigured on a bad or taken name."""
    name = definition.name
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ImproperlyConfigured(
            f"Workflow name {name!r} is not valid: use 1 to 200 letters, digits, '_', '.', ':' "
            f"or '-', starting with a letter or '_'."
        )
    if definition.timeout is not None and definition.timeout.total_seconds() <= 0:
        raise ImproperlyConfigured(f"Workflow {name!r} has a timeout of {definition.timeout}; it must be positive.")
    if definition.retention is not None and definition.retention.total_seconds() <= 0:
        raise ImproperlyConfigured(f"Workflow {name!r} has a retention of {definition.retention}; it must be positive.")
    if definition.retry is not None and not isinstance(definition.retry, RetryPolicy):
        raise ImproperlyConfigured(f"Workflow {name!r} has retry={definition.retry!r}; use a durable.RetryPolicy.")
    if isinstance(definition.max_attempts, bool) or not isinstance(definition.max_attempts, int) or definition.max_attempts < 1:
        raise ImproperlyConfigured(
            f"Workflow {name!r} has max_attempts={definition.max_attempts!r}; it must be at least 1."
        )
    existing = _registry.get(name)
    # Re-registering the same function (a module imported twice, the autoreloader) is fine;
    # two different functions under one name would make runs ambiguous.
    if existing is not None and existing.qualified_name != definition.qualified_name:
        raise ImproperlyConfigured(
            f"Workflow name {name!r} is registered twice: by {existing.qualified_name} and by "
            f"{definition.qualified_name}. Give one of them another name."
        )
    _registry[name] = definition


def get(name_or_fn: str | Callable) -> WorkflowDefinition:
    """Return the definition for a registered name or decorated function; raise WorkflowNotFound."""
    if callable(name_or_fn):
        definition = getattr(name_or_fn, "durable_workflow", None)
        if definition is None:
            raise WorkflowNotFound(
                f"{name_or_fn!r} is not a workflow: decorate it with @durable.workflow(...)."
            )
        return definition
    try:
        return _registry[name_or_fn]
    except (KeyError, TypeError):
        shown = repr(name_or_fn)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise WorkflowNotFound(f"No workflow is registered under the name {shown}.{closest(name_or_fn)}") from None


def closest(name) -> str:
    """" Did you mean 'x'?" for the registered name closest to `name`, or nothing."""
    import difflib

    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name[:200], list(_registry), n=1, cutoff=0.75)
    return f" Did you mean {close[0]!r}?" if close else ""


def names() -> list[str]:
    return sorted(_registry)


def definitions() -> list[WorkflowDefinition]:
    return [_registry[name] for name in sorted(_registry)]


def find(name: str) -> WorkflowDefinition | None:
    """The definition registered under `name`, or None."""
    return _registry.get(name)


# Callables that find a definition the registry does not hold yet, by its name: tasks.py adds
# one that imports a django.tasks task's module. Kept here, so that the engine finds tasks
# without knowing of tasks.py, which sits above it.
_finders: list[Callable[[str], WorkflowDefinition | None]] = []


def add_finder(finder: Callable[[str], WorkflowDefinition | None]) -> None:
    """Let `finder(name)` find definitions that no module imported so far registered (once each)."""
    if finder not in _finders:
        _finders.append(finder)


def load(name: str) -> WorkflowDefinition:
    """The definition registered under `name`, or one a finder registers now; raise WorkflowNotFound."""
    definition = find(name)
    for finder in _finders:
        if definition is not None:
            break
        definition = finder(name)
    return definition if definition is not None else get(name)


def sender_of(name: str):
    """The workflow function registered under `name` (the sender of its signals), or None."""
    definition = _registry.get(name)
    return definition.fn if definition else None
