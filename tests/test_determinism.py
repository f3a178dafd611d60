"""The system check that points at non-deterministic calls in workflow bodies."""

import datetime
import random
import time
import uuid
from datetime import datetime as dt_class

from django.utils import timezone

from django_durable import checks, registry
from django_durable.determinism import nondeterministic_calls


def careless(ctx, items):
    started = time.time()
    stamp = timezone.now()
    ctx.step("send", print, dt_class.now())
    token = uuid.uuid4()
    if random.random() < 0.5:
        pass
    return [started, stamp, token, datetime.date.today()]


def careful(ctx):
    def inside_a_step():
        return time.time(), uuid.uuid4()

    stamp = ctx.now()
    values = ctx.step("values", inside_a_step)
    ctx.step("lambda", lambda: random.random())
    return stamp, values, time.sleep  # a reference, not a call


def test_calls_outside_steps_are_found_with_their_line():
    found = nondeterministic_calls(careless)
    assert len(found) == 6
    assert {call for call, _ in found} == {
        "time.time", "timezone.now", "dt_class.now", "uuid.uuid4", "random.random", "datetime.date.today"
    }
    lines = dict(found)
    assert lines["time.time"].endswith(f"test_determinism.py:{careless.__code__.co_firstlineno + 1}")


def test_calls_inside_steps_and_recorded_values_are_fine():
    assert nondeterministic_calls(careful) == []


def test_the_system_check_warns_for_registered_workflows():
    definition = registry.WorkflowDefinition(name="tests.determinism.careless", fn=careless)
    registry.register(definition)
    try:
        warnings = [w for w in checks.check_workflow_determinism() if w.obj is careless]
    finally:
        registry._registry.pop("tests.determinism.careless")
    assert {w.id for w in warnings} == {"django_durable.W003"}
    assert len(warnings) == 6
    assert any("calls time.time() outside a step" in w.msg for w in warnings)
    assert all("ctx.now()" in w.hint for w in warnings)


def test_the_project_workflows_pass_the_check():
    assert checks.check_workflow_determinism() == []


def imports_its_own(ctx):
    import datetime as clock_module
    from time import time as now_seconds

    import datetime

    return datetime.datetime.now(), clock_module.date.today(), now_seconds()


def test_a_module_imported_inside_the_workflow_is_seen_too():
    assert sorted(call for call, _ in nondeterministic_calls(imports_its_own)) == [
        "clock_module.date.today", "datetime.datetime.now", "now_seconds"]


def imports_a_framework(ctx):
    from tests.testapp.never_loaded import answer
    import secrets

    return answer(), secrets.token_hex(4)


def test_the_check_imports_no_module_a_workflow_body_imports_but_the_known_calls_own(tmp_path, monkeypatch):
    """A body that imports a module inside it keeps that module's cost out of processes that do
    not run it; the check, which every worker runs at its start, must not pay it for them. The
    modules the known calls live in are still imported and judged."""
    import sys

    monkeypatch.delitem(sys.modules, "secrets", raising=False)
    assert "tests.testapp.never_loaded" not in sys.modules
    assert [call for call, _ in nondeterministic_calls(imports_a_framework)] == ["secrets.token_hex"]
    assert "tests.testapp.never_loaded" not in sys.modules
    assert "secrets" in sys.modules


def _marked(fn) -> list[str]:
    """The lines of `fn`'s file that carry the comment `# here` inside fn, as "file:line"."""
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return [f"{inspect.getsourcefile(fn)}:{first + n}" for n, line in enumerate(lines)
            if line.rstrip().endswith("# here")]


def _decorated(fn):
    return fn


class _Workflows:
    @staticmethod
    @_decorated
    def indented(ctx):
        ctx.step("a", print)
        return time.time()  # here

    @staticmethod
    def with_a_string_at_the_margin(ctx):
        text = """
a line at the margin"""
        return text, time.time()  # here


def nested_then_a_long_call(ctx):
    stamp = uuid.uuid4()  # here

    def inside():
        return time.time()

    return ctx.step(
        "b", inside, random.random(),  # here
    ) and stamp


def test_each_call_is_found_on_the_line_it_is_on_whatever_the_shape_of_the_function():
    """The check reads a function's lines as its code spans them, without tokenizing its source:
    indented and decorated, ending in a call over several lines after a nested function, and
    indented with a string at the margin (which inspect's textwrap.dedent cannot shift)."""
    for fn in (_Workflows.indented, nested_then_a_long_call, _Workflows.with_a_string_at_the_margin):
        assert sorted(where for _, where in nondeterministic_calls(fn)) == sorted(_marked(fn)), fn.__name__


def test_what_the_code_span_cannot_read_is_read_through_inspect_alike(monkeypatch):
    """Where a code object gives no line span (a Python run with -X no_debug_ranges), the check
    reads the function through inspect, shifted by the def's margin the same way."""
    from django_durable import determinism

    monkeypatch.setattr(determinism, "_last_line", lambda code: 0)
    for fn in (_Workflows.indented, nested_then_a_long_call, _Workflows.with_a_string_at_the_margin):
        assert sorted(where for _, where in nondeterministic_calls(fn)) == sorted(_marked(fn)), fn.__name__


def test_a_function_without_source_is_passed_over():
    namespace = {}
    exec("def made(ctx):\n    import time\n    return time.time()\n", namespace)
    assert nondeterministic_calls(namespace["made"]) == []
    assert nondeterministic_calls(print) == []
