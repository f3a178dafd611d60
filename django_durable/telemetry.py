"""Traces and log context for runs: OpenTelemetry when ``opentelemetry-api`` is installed, and the
run id and step key on every log line a worker writes.

Traces. A run started while a span is current (a request traced by your OpenTelemetry set-up)
carries that span's W3C ``traceparent`` in its stored input (under "trace", beside "args" and
"kwargs"). Each advance of the run, on whichever worker, is a span "durable.run <workflow>" whose
parent is that one, and each attempt of a step (parallel branches too) a span "durable.step <key>"
under it: a run is one trace, across workers and restarts, joined to the request that started it.
Children started by a run carry its trace on. Without opentelemetry-api, or with it but no tracer
provider set (no SDK configured), no span is made: a step costs a context variable's set and
reset (0.5 µs), for the log context.

Logs. While a worker advances a run or runs a step, ``logging`` records (of every logger) get
``run_id``, ``workflow`` and ``step_key`` attributes (empty outside), through LogContextFilter,
which the worker's own handler installs and projects can add to theirs.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from contextlib import contextmanager

from django.conf import settings
from django.utils.log import RequireDebugFalse, RequireDebugTrue

# The run (its id, as given: made text only when a record is logged), workflow and step worked on.
_log_context: contextvars.ContextVar[tuple[object, str, str]] = contextvars.ContextVar(
    "durable_log_context", default=("", "", ""))


def carried() -> dict:
    """{"trace": traceparent} for a run started now inside a valid span, else {} (stored in its input)."""
    trace = _tracing()
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {"trace": carrier["traceparent"]} if "traceparent" in carrier else {}


def traceparent_of(stored_input: str | None) -> str | None:
    """The traceparent a run's stored input carries (see carried()), or None."""
    if not stored_input or '"trace"' not in stored_input or _tracing() is None:
        return None
    from .serialization import decode

    value = (decode(stored_input) or {}).get("trace")
    return value if isinstance(value, str) else None


class _LogContext:
    """Without OpenTelemetry: only the log context, at the cost of a context variable."""

    __slots__ = ("value", "token")

    def __init__(self, value):
        self.value = value

    def __enter__(self):
        self.token = _log_context.set(self.value)

    def __exit__(self, *exc):
        _log_context.reset(self.token)
        return False


def run_span(run_id, workflow: str, traceparent: str | None, *, attempt: int, delivery: int):
    """The span of one advance of a run (child of the span that started it), and the log context."""
    trace = _tracing()
    if trace is None:
        return _LogContext((run_id, workflow, ""))
    return _span(f"durable.run {workflow}", (run_id, workflow, ""), traceparent,
                 {"durable.run_id": str(run_id), "durable.workflow": workflow, "durable.run_attempt": attempt,
                  "durable.delivery": delivery}, kind=trace.SpanKind.CONSUMER)


def step_span(run_id, workflow: str, key: str, attempt: int, traceparent: str | None = None):
    """The span of one attempt of a step (under the current run span, or `traceparent` for a
    branch run by a worker of its own), and the log context naming the step."""
    if _tracing() is None:
        return _LogContext((run_id, workflow, key))
    return _span(f"durable.step {key}", (run_id, workflow, key), traceparent,
                 {"durable.run_id": str(run_id), "durable.workflow": workflow, "durable.step": key,
                  "durable.step_attempt": attempt}, errors=True)


@contextmanager
def _span(name: str, log_context, traceparent, attributes, *, kind=None, errors=False):
    """A span under `traceparent` (else the current one), with the log context set; with `errors`,
    an exception leaving it marks it ERROR (a step's attempt; a run's advance ends by exceptions
    that are not failures: a wait, a lost lease)."""
    from opentelemetry import propagate, trace

    token = _log_context.set(log_context)
    try:
        parent = propagate.extract({"traceparent": traceparent}) if traceparent else None
        with _tracer().start_as_current_span(name, context=parent, kind=kind or trace.SpanKind.INTERNAL,
                                             attributes=attributes) as span:
            try:
                yield span
            except BaseException as exc:
                if errors:
                    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"[:500]))
                raise
    finally:
        _log_context.reset(token)


def _tracing():
    """The OpenTelemetry API (its `trace` module) when spans are recorded, else None.

    Spans are recorded once a tracer provider was set; without one, the API's spans are no-ops
    that would still cost some 9 µs a step. Setting a provider imports the API, so a process in
    which nothing imported it records none, and this module never imports it itself (the import
    is some 10 ms of every process's start). The provider, once set, stays: the API's own global
    is read (its public getter costs more than a step's span)."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:  # an API without that global: ask it
        return None if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider) else trace
    return trace if provider is not None else None


_UNKNOWN = object()


def _tracer():
    from opentelemetry import trace

    return trace.get_tracer("django_durable")


def emits(logger: logging.Logger, level: int) -> bool:
    """Whether a record of `level` logged on `logger` would be written by some handler: the logger
    enabled for it, and a handler on its way up (as ``Logger.callHandlers`` walks them) whose level
    lets it through and whose filters are not known to drop it. Django's default LOGGING enables
    its loggers at INFO with a console handler only while DEBUG is on (``RequireDebugTrue``) and
    mail to admins only at ERROR: such a record is made, then dropped by every handler.

    Known here are Django's two DEBUG filters and a filter with a ``drops(name, level)`` method
    that says so (the worker's own handler has one); any other filter, a logger's own filters or a
    handler's own ``filter()`` may let a record through, so they count as writing it.
    """
    if not logger.isEnabledFor(level):
        return False
    if logger.filters:
        return True
    found = False
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            found = True
            if level >= handler.level and _passes(handler, logger.name, level):
                return True
        current = current.parent if current.propagate else None
    if not found:  # Python's last resort: stderr, at WARNING and above
        return logging.lastResort is not None and level >= logging.lastResort.level
    return False


def _passes(handler: logging.Handler, name: str, level: int) -> bool:
    """False if one of `handler`'s filters is sure to drop every record of logger `name` at
    `level` now (Django's RequireDebugTrue without DEBUG, RequireDebugFalse with it, a filter
    whose drops() says so); True otherwise."""
    if type(handler).filter is not logging.Filterer.filter:
        return True
    if not handler.filters:
        return True
    for kept in handler.filters:
        kind = type(kept)
        if (kind is RequireDebugTrue and not settings.DEBUG) or (kind is RequireDebugFalse and settings.DEBUG):
            return False
        drops = getattr(kept, "drops", None)
        if drops is not None and drops(name, level):
            return False
    return True


class LogContextFilter(logging.Filter):
    """Adds run_id, workflow and step_key (the run and step being worked on, or "") to records."""

    def filter(self, record: logging.LogRecord) -> bool:
        run_id, record.workflow, record.step_key = _log_context.get()
        record.run_id = str(run_id)
        return True


class WorkerFormatter(logging.Formatter):
    """The worker's own lines: time, level, process, the message, then "run=… step=…" when a run is
    being worked on (needs LogContextFilter on the handler)."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s [%(process)d] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        run_id = getattr(record, "run_id", "")
        if not run_id:
            return line
        step = getattr(record, "step_key", "")
        return f"{line} [run={run_id}{f' step={step}' if step else ''}]"


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, process, message, run_id, workflow, step_key
    (and the exception's text), for log pipelines (DURABLE_LOG_FORMAT = "json")."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        line = {
            "time": self.formatTime(record), "level": record.levelname, "logger": record.name,
            "process": record.process, "message": record.getMessage(),
            "run_id": getattr(record, "run_id", ""), "workflow": getattr(record, "workflow", ""),
            "step_key": getattr(record, "step_key", ""),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)
