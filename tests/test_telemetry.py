"""OpenTelemetry: a run is one trace joined to the span that started it, across worker processes;
and every line a worker writes about a run names the run and the step (text or JSON)."""

import json
import re

import pytest

import django_durable as durable
from django_durable.models import WorkflowRun
from django_durable.testing import drain
from tests.conftest import ROOT
from tests.testapp import spans

pytestmark = pytest.mark.django_db(transaction=True)

otel = pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk is not installed")


@pytest.fixture(scope="module")
def exporter():
    """The SDK with an in-memory exporter for this process (a provider can be set once per process)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


def test_a_run_and_its_steps_are_spans_of_the_trace_that_started_it(exporter):
    from opentelemetry import trace

    exporter.clear()
    with trace.get_tracer("tests").start_as_current_span("POST /checkout") as request_span:
        run = durable.start("tests.three_steps", x=1)
        request = request_span.get_span_context()
    assert WorkflowRun.objects.get(pk=run.pk).get_input()["trace"].startswith(f"00-{request.trace_id:032x}-")
    drain()
    finished = {span.name: span for span in exporter.get_finished_spans()}
    advance = finished["durable.run tests.three_steps"]
    assert advance.context.trace_id == request.trace_id and advance.parent.span_id == request.span_id
    assert advance.attributes["durable.run_id"] == str(run.pk)
    for key in "abc":
        step = finished[f"durable.step {key}"]
        assert (step.context.trace_id, step.parent.span_id) == (request.trace_id, advance.context.span_id)
    untraced = durable.start("tests.three_steps")  # no span current: no trace stored, a trace of its own
    assert "trace" not in WorkflowRun.objects.get(pk=untraced.pk).get_input()


def out_of_stock():
    raise durable.NonRetryableError("no stock")


@durable.workflow("tests.telemetry.fails")
def fails(ctx):
    ctx.step("reserve", out_of_stock)


def test_a_failed_attempt_marks_its_span(exporter):
    exporter.clear()
    durable.start(fails)
    drain()
    [step] = [span for span in exporter.get_finished_spans() if span.name.startswith("durable.step")]
    assert step.status.status_code.name == "ERROR" and "no stock" in step.status.description


@pytest.mark.timeout(120)
def test_a_run_across_two_worker_processes_is_one_trace(exporter, start_worker, tmp_path):
    from opentelemetry import trace

    path = tmp_path / "spans.jsonl"
    env = {"DURABLE_TEST_SPANS": str(path)}
    with trace.get_tracer("tests").start_as_current_span("POST /trace-me") as request_span:
        run = durable.start("tests.traced")
    request = request_span.get_span_context()
    assert start_worker(env=env).wait() == 0  # "before", then waits for "go"
    durable.signal(run.pk, "go")
    assert start_worker(env=env).wait() == 0  # "after", in another process
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    written = [span for span in spans.read(path) if span["attributes"].get("durable.run_id") == str(run.pk)]
    advances = [span for span in written if span["name"] == "durable.run tests.traced"]
    assert len({span["pid"] for span in advances}) == 2
    assert {span["trace_id"] for span in written} == {f"{request.trace_id:032x}"}
    assert {span["parent_id"] for span in advances} == {f"{request.span_id:016x}"}
    steps = {span["name"]: span for span in written if span["name"].startswith("durable.step")}
    assert set(steps) == {"durable.step before", "durable.step after"}
    by_id = {span["span_id"]: span for span in advances}
    assert by_id[steps["durable.step before"]["parent_id"]]["pid"] != by_id[steps["durable.step after"]["parent_id"]]["pid"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_every_line_about_a_run_names_the_run_and_the_step(start_worker, log_format):
    run = durable.start("tests.traced")
    durable.signal(run.pk, "go")
    worker = start_worker(env={"DURABLE_TEST_OWN_LOGGING": "1", "DURABLE_LOG_FORMAT": log_format})
    assert worker.wait() == 0
    lines = [line for line in worker.log().splitlines() if line.strip()]
    if log_format == "json":
        records = [json.loads(line) for line in lines]
        started = next(r for r in records if "started" in r["message"] and r["run_id"])
        assert (started["run_id"], started["workflow"], started["step_key"]) == (str(run.pk), "tests.traced", "")
        late = next(r for r in records if r["message"] == "the courier is late")
        assert (late["run_id"], late["step_key"], late["logger"]) == (str(run.pk), "after", "tests.steps")
    else:
        started = next(line for line in lines if f"Run {run.pk} of tests.traced started" in line)
        assert started.endswith(f"[run={run.pk}]")
        late = next(line for line in lines if "the courier is late" in line)
        assert re.search(rf"WARNING \[\d+\] the courier is late \[run={run.pk} step=after\]$", late), late


def test_the_documented_logging_configuration_names_the_run_and_step(capsys):
    """docs/telemetry.md's LOGGING example, configured as written, on lines inside a run and a step."""
    import logging
    import logging.config
    from pathlib import Path

    from django_durable import telemetry

    text = (Path(__file__).resolve().parent.parent / "docs" / "telemetry.md").read_text()
    code = re.search(r"<!-- example: logging [^>]*-->\n```python\n(.*?)\n```", text, re.S).group(1)
    namespace = {}
    exec(compile(code, "docs/telemetry.md <example logging>", "exec"), namespace)  # noqa: S102
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        logging.config.dictConfig({**namespace["LOGGING"], "disable_existing_loggers": False})
        with telemetry.run_span("01ab", "orders.fulfil", None, attempt=1, delivery=1):
            with telemetry.step_span("01ab", "orders.fulfil", "charge", 1):
                logging.getLogger("shop.payments").info("charged")
        logging.getLogger("shop.payments").info("idle")
    finally:
        root.handlers[:], root.level = saved
    lines = capsys.readouterr().err.splitlines()
    assert lines[-2].endswith("INFO charged run=01ab step=charge") and lines[-1].endswith("INFO idle run= step=")


def test_a_process_that_never_imported_opentelemetry_records_no_span_and_does_not_import_it():
    """A tracer provider can only be set by code that imported the API; where nothing did (the
    API installed, as here, but unused), django-durable neither records spans nor pays the
    import at every start."""
    import os
    import subprocess
    import sys

    code = """
import sys, django
django.setup()
from django_durable import telemetry
parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
with telemetry.run_span("r", "w", parent, attempt=1, delivery=1):
    with telemetry.step_span("r", "w", "k", 1):
        pass
assert telemetry.carried() == {}
assert telemetry.traceparent_of('{"trace": "%s"}' % parent) is None
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings")
    env.pop("DURABLE_TEST_SPANS", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def loggers():
    """A logger tree of its own, cut off from the root (where pytest's capture handlers hear all):
    "durable_t.django" handled as Django's default LOGGING handles its "django" logger. Call it in
    the test's body: pytest adds its capture handler to every logger that does not propagate as
    each phase of a test begins."""
    import logging

    from django.utils.log import RequireDebugFalse, RequireDebugTrue

    parent, child = logging.getLogger("durable_t.django"), logging.getLogger("durable_t.django.tasks")

    def configure():
        console, mail = logging.NullHandler(), logging.NullHandler()
        console.setLevel(logging.INFO)
        console.addFilter(RequireDebugTrue())
        mail.setLevel(logging.ERROR)
        mail.addFilter(RequireDebugFalse())
        parent.setLevel(logging.INFO)
        parent.propagate = False
        parent.handlers = [console, mail]
        return parent, child

    yield configure
    parent.handlers, parent.propagate = [], True
    parent.setLevel(logging.NOTSET)
    child.setLevel(logging.NOTSET)
    child.filters.clear()


def test_a_record_is_written_only_where_a_handler_would_write_it(loggers, settings):
    import logging

    from django_durable.telemetry import emits

    parent, child = loggers()
    settings.DEBUG = False  # Django's default: the console handler drops all, mail takes errors
    assert not emits(child, logging.INFO) and emits(child, logging.ERROR)
    settings.DEBUG = True  # the console writes INFO and above; the mail is off
    assert emits(child, logging.INFO) and not emits(child, logging.DEBUG)

    settings.DEBUG = False
    child.setLevel(logging.CRITICAL)  # the logger itself not enabled
    assert not emits(child, logging.ERROR)
    child.setLevel(logging.NOTSET)
    console = parent.handlers[0]
    known = console.filters
    console.filters = [lambda record: False]  # a filter not known here may let records through
    assert emits(child, logging.INFO)
    console.filters = known
    assert not emits(child, logging.INFO)
    child.addFilter(lambda record: True)  # so may the logger's own
    assert emits(child, logging.INFO)
    child.filters.clear()

    from django_durable.management.commands.durable_worker import WorkerLines

    worker = logging.NullHandler()  # the worker's own: its lines, and others' warnings
    worker.addFilter(WorkerLines())
    parent.handlers = [worker]
    assert not emits(child, logging.INFO) and emits(child, logging.WARNING)
    own = logging.getLogger("django_durable.worker")  # its own lines at INFO too
    kept = own.handlers, own.propagate, own.level
    own.handlers, own.propagate = [worker], False
    own.setLevel(logging.INFO)
    try:
        assert emits(own, logging.INFO)
    finally:
        own.handlers, own.propagate = kept[:2]
        own.setLevel(kept[2])

    parent.handlers = []  # no handler anywhere: Python's last resort writes warnings and above
    assert not emits(child, logging.INFO) and emits(child, logging.WARNING)
