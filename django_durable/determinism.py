"""Finding calls in a workflow body that differ between the first run and a replay."""

from __future__ import annotations

import ast
import builtins
import datetime
import inspect
import linecache
import os
import sys
import time
import uuid

from django.utils import timezone

KNOWN = {
    time.time, time.time_ns, time.monotonic, time.perf_counter,
    datetime.datetime.now, datetime.datetime.utcnow, datetime.datetime.today, datetime.date.today,
    timezone.now, uuid.uuid1, uuid.uuid4, os.urandom,
}


def _nondeterministic(obj) -> bool:
    try:
        if obj in KNOWN:
            return True
    except TypeError:  # unhashable
        return False
    # The functions of the random and secrets modules (bound methods of a hidden generator).
    module = getattr(obj, "__module__", None) or getattr(getattr(obj, "__self__", None), "__module__", None)
    return callable(obj) and module in ("random", "secrets")


def nondeterministic_calls(fn) -> list[tuple[str, str]]:
    """Return (call, "file:line") for each call in `fn`'s own body to a known non-deterministic function.

    Nested functions and lambdas are skipped: they usually run as steps. Calls the source does
    not show (through variables, other modules) are not seen.
    """
    own = inspect.unwrap(fn)  # a decorated function's names are its own module's
    try:
        filename, function, offset = _definition(own)
    except (OSError, TypeError):  # no source, or not a function
        return []
    if function is None:
        return []
    nodes = list(_own_nodes(function))
    namespace = {**vars(builtins), **getattr(own, "__globals__", {}), **_local_imports(nodes)}
    found = []
    for node in nodes:
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func)
            if dotted and _nondeterministic(_resolve(dotted, namespace)):
                found.append((dotted, f"{filename}:{offset + node.lineno}"))
    return found


def _definition(fn) -> tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | None, int]:
    """(its file, the node of `fn`'s def, what to add to the node's line numbers to number them
    as the file does). The lines are those its code object spans: a worker runs this check at its
    start, and inspect.getsource() finds them by tokenizing in Python (and compiling tokenize's
    expressions first), 1-2 ms a workflow here. What that cannot read is read as inspect finds it."""
    filename = inspect.getsourcefile(fn) or "?"
    code = getattr(fn, "__code__", None)
    if code is not None and (last := _last_line(code)) >= (first := code.co_firstlineno):
        function = _parsed_def(linecache.getlines(filename, getattr(fn, "__globals__", None))[first - 1:last])
        if function is not None and function.name == code.co_name:
            return filename, function, first - 1
    lines, first = inspect.getsourcelines(fn)
    return filename, _parsed_def(lines), first - 1


def _parsed_def(lines: list[str]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The def these source lines begin with, shifted left by its indentation (each line of its
    code has it; the lines of a string in it may not, which textwrap.dedent would shift none of);
    None if they do not parse into one."""
    margin = lines[0][:len(lines[0]) - len(lines[0].lstrip())] if lines else ""
    try:
        body = ast.parse("".join(line.removeprefix(margin) for line in lines)).body
    except SyntaxError:
        return None
    return body[0] if body and isinstance(body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _last_line(code) -> int:
    """The last line of source `code` (and the functions defined in it) has instructions for."""
    last = max((end for _, end, _, _ in code.co_positions() if end is not None), default=0)
    return max([last, *(_last_line(const) for const in code.co_consts if inspect.iscode(const))])


def _local_imports(nodes) -> dict:
    """The names a function body's `nodes` (_own_nodes) import (``import datetime`` inside it),
    bound as it would bind them, from the modules this process has loaded; a module that is not
    loaded is left out unless the known calls live in it (see _module)."""
    bound = {}
    for node in nodes:
        try:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name if alias.asname else alias.name.split(".")[0]
                    if (module := _module(name)) is not None:
                        bound[alias.asname or name] = module
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if (module := _module(node.module)) is not None:
                    for alias in node.names:
                        bound[alias.asname or alias.name] = getattr(module, alias.name, None)
        except Exception:  # noqa: BLE001 - what the check cannot import, it does not judge
            continue
    return bound


# Where the known calls live: standard modules, cheap to import if not loaded yet.
JUDGED_MODULES = {"datetime", "os", "random", "secrets", "time", "uuid"}


def _module(name: str):
    """The module `name` if this process has loaded it, or imports it if the known calls live in
    it. Others are not imported: a workflow body that imports a module inside it often does so to
    keep its cost (an AI framework's seconds) out of processes that never run it, and every worker
    runs this check at its start."""
    module = sys.modules.get(name)
    if module is None and name.split(".")[0] in JUDGED_MODULES:
        import importlib

        module = importlib.import_module(name)
    return module


def _own_nodes(function):
    """The nodes of `function`'s body, not descending into nested functions, lambdas or classes."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    stack = [node for node in function.body if not isinstance(node, nested)]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, nested):
                stack.append(child)


def _dotted(node) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _resolve(dotted: str, namespace: dict):
    head, *rest = dotted.split(".")
    obj = namespace.get(head)
    for part in rest:
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj
