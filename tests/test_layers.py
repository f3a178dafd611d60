"""The package's layers point down: no import cycle, and no module imports one of a higher layer.

Every import counts, those inside functions too: a lazy import is still a dependency. The layers,
from the bottom up (docs/internals.md, "Layers"):

0. leaf modules: no model, no database table (ids, clock, conf, retry, registry, cron, ...);
1. the tables and what they stand on: models/, serialization and the payload store, telemetry,
   the partition key a model fills in;
2. what works on tables without the workpool: approvers, partitioning;
3. the workpool: claims, fenced writes, a run's transitions, wakeups, reaping;
4. the engine: replay and the context (nothing from services/, tasks.py or above);
5. what the surfaces call: services/, schedules, tasks.py, contrib/, the catalog, checks, retention, ...;
6. the surfaces and the processes: admin/, api/, views, the worker, the management commands.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "django_durable"

LAYERS = [
    {"ids", "clock", "conf", "humanize", "interrupts", "journal", "determinism", "exceptions", "retry", "faults", "startup",
     "queues", "databases", "routers", "registry", "signals", "cron", "horizon"},
    {"models", "models.*", "payloads", "serialization", "telemetry", "partitioning.keys", "partitioning.tables"},
    {"approvers", "partitioning", "partitioning.*"},
    {"workpool", "workpool.*"},
    {"engine", "engine.*"},
    {"services", "services.*", "schedules", "tasks", "catalog", "checks", "replaycheck", "export", "retention",
     "stats", "subjects", "contrib", "contrib.*"},
    {"", "apps", "testing", "pytest_plugin", "urls", "views", "metrics", "health", "admin", "admin.*", "api", "api.*",
     "worker", "worker.*", "management", "management.*", "templatetags", "templatetags.*"},
]


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package by its dotted name below it ("" for the package itself)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] in ("migrations", "templates", "static"):
            continue
        package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if package else parts)] = (path, package)
    return found


def graph() -> dict[str, set[str]]:
    """module -> the modules of the package it imports (the most precise one each import names)."""
    known = modules()

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        for end in range(len(parts), -1, -1):
            candidate = ".".join(parts[:end])
            if candidate in known:
                return candidate
        return None

    edges = {}
    for name, (path, package) in known.items():
        here = name.split(".") if name else []
        base = here if package else here[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named = [alias.name.removeprefix("django_durable").lstrip(".") for alias in node.names
                         if alias.name == "django_durable" or alias.name.startswith("django_durable.")]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    origin = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
                elif node.module and (node.module + ".").startswith("django_durable."):
                    origin = node.module.removeprefix("django_durable").lstrip(".")
                else:
                    continue
                # `from X import a`: the submodule X.a if there is one, else X itself.
                named = [f"{origin}.{alias.name}".lstrip(".") if f"{origin}.{alias.name}".lstrip(".") in known
                         else origin for alias in node.names]
            else:
                continue
            targets.update(target for target in map(resolve, named) if target is not None and target != name)
        edges[name] = targets
    return edges


def layer_of(name: str) -> int | None:
    for index, layer in enumerate(LAYERS):
        if name in layer or any(name.startswith(pattern[:-1]) for pattern in layer if pattern.endswith(".*")):
            return index
    return None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, without recursion)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_import_graph_has_no_cycle():
    assert cycles(graph()) == []


def test_every_module_has_a_layer_and_imports_only_its_own_or_lower_ones():
    edges = graph()
    unplaced = sorted(name for name in edges if layer_of(name) is None)
    assert unplaced == [], f"Give these modules a layer in LAYERS: {unplaced}"
    upward = sorted(f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
                    for name, targets in edges.items() for target in targets if layer_of(target) > layer_of(name))
    assert upward == []


def test_the_checks_themselves_see_a_cycle_and_an_upward_import():
    """The graph builder finds what it is there to find (a test that cannot fail is a defect)."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = graph()
    assert "services.control" in edges["admin.runs"]  # a module-level import
    assert "workpool.messages" in edges["engine.flow"]  # one inside a function
    assert layer_of("engine.replay") < layer_of("services.control")


def test_every_import_path_the_docs_name_still_resolves():
    """Moving a module into a package (models/, worker/) keeps every path the docs give working."""
    import importlib
    import re

    from django.apps import apps

    root = PACKAGE.parent
    texts = [path.read_text() for path in (root / "docs").rglob("*.md")] + [(root / "README.md").read_text()]
    named = {name for text in texts for name in re.findall(r"django_durable(?:\.[A-Za-z_][A-Za-z0-9_]*)+", text)}
    permissions = {f"{action}_{model._meta.model_name}" for model in apps.get_app_config("django_durable").get_models()
                   for action in model._meta.default_permissions}
    permissions |= {codename for model in apps.get_app_config("django_durable").get_models()
                    for codename, _ in model._meta.permissions}
    unresolved = []
    for name in sorted(named):
        parts = name.split(".")
        if re.fullmatch(r"[EW]\d{3}", parts[-1]) or (len(parts) == 2 and parts[1] in permissions):
            continue  # a system check's id, or a permission (app_label.codename)
        for end in range(len(parts), 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:end]))
            except ImportError:
                continue
            for attribute in parts[end:]:
                found = getattr(found, attribute, None)
            if found is None:
                unresolved.append(name)
            break
    assert len(named) > 30 and unresolved == []
