"""The registered workflows and tasks as data: ``durable.workflows()``, ``GET workflows/definitions/``,
``manage.py durable workflows`` and the admin's Workflows page all read this."""

from __future__ import annotations

from . import conf, registry


def workflows(*, shapes: bool = True) -> list[dict]:
    """Every registered workflow and durable task, by name: what each is and how its runs go.

    Each is ``{"name", "kind", "description", "function", "queue", "priority", "max_attempts",
    "timeout", "retry", "compensate_on_failure", "compensate_on_cancel", "schedule", "input",
    "shape", "problems"}``: the docstring, the run defaults, the declared schedule, the parameters
    the function takes, and (unless not `shapes`) ``durable.describe()``'s shape and the problems
    found in it (keys two calls take, unknown approvers).
    """
    return [definition_data(definition, shape=shapes) for definition in registry.definitions()]


def definition_data(definition, *, shape: bool = True) -> dict:
    """One registered workflow as data (see workflows())."""
    import inspect

    from .retry import from_setting

    retry = definition.retry or from_setting(conf.get("DEFAULT_RETRY"))  # the steps' policy
    data = {
        "name": definition.name,
        "kind": definition.kind,
        "description": inspect.getdoc(_function(definition)) or "",
        "function": definition.qualified_name,
        "queue": definition.queue,
        "priority": definition.priority,
        "max_attempts": definition.max_attempts,
        "timeout": definition.timeout.total_seconds() if definition.timeout is not None else None,
        "retry": _retry(retry),
        "compensate_on_failure": definition.compensate_on_failure,
        "compensate_on_cancel": definition.compensate_on_cancel,
        "schedule": definition.schedule,
        "input": _parameters(definition),
        "input_schema": input_schema(definition),
    }
    if shape:
        described = _described(definition.name)
        data["shape"], data["problems"] = described["shape"], described["problems"]
    return data


def _function(definition):
    """The function its author wrote: the workflow's, or a task's (not the call that wraps it)."""
    return definition.fn.task.func if definition.kind == "task" else definition.fn


def _described(name: str) -> dict:
    """durable.describe() of a workflow (its code is run once per process: describe() keeps it)."""
    from .engine.describe import describe

    return describe(name)


def awaited_signals(name: str) -> tuple[list[str], bool] | None:
    """The signal names a workflow's shape waits for (sorted), and whether the shape is whole (no
    ``stop`` where the describing run could not go on): a name outside a whole shape's is never taken
    by this code. None for a workflow not registered in this process."""
    if registry.find(name) is None:
        return None
    names, whole = set(), True

    def walk(nodes):
        nonlocal whole
        for node in nodes:
            if node["type"] == "signal":
                names.add(node["name"])
            elif node["type"] == "stop":
                whole = False
            for branch in node.get("branches", []):
                walk(branch.get("shape", []))

    walk(_described(name)["shape"])
    return sorted(names), whole


def _retry(policy) -> dict:
    return {"max_attempts": policy.max_attempts, "initial_backoff": policy.initial_backoff,
            "backoff_coefficient": policy.backoff_coefficient, "max_backoff": policy.max_backoff,
            "non_retryable": [f"{t.__module__}.{t.__qualname__}" for t in policy.non_retryable]}


def _parameters(definition) -> list[dict]:
    """The parameters a run's input fills (after the context): name, kind, default if any."""
    import inspect

    function = _function(definition)
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return []
    if definition.kind == "workflow" or getattr(getattr(definition.fn, "task", None), "takes_context", False):
        parameters = parameters[1:]  # the context
    shown = []
    for parameter in parameters:
        entry = {"name": parameter.name, "kind": parameter.kind.name.lower()}
        if parameter.default is not parameter.empty:
            entry["default"] = repr(parameter.default)
        if parameter.annotation is not parameter.empty:
            annotation = parameter.annotation
            entry["annotation"] = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
        shown.append(entry)
    return shown


# DRF fields as JSON Schema types, by class name along the field's MRO (most specific first).
_FIELD_TYPES = {
    "BooleanField": {"type": "boolean"}, "IntegerField": {"type": "integer"}, "FloatField": {"type": "number"},
    "DecimalField": {"type": "string", "format": "decimal"}, "DateTimeField": {"type": "string", "format": "date-time"},
    "DateField": {"type": "string", "format": "date"}, "TimeField": {"type": "string", "format": "time"},
    "DurationField": {"type": "string"}, "UUIDField": {"type": "string", "format": "uuid"},
    "EmailField": {"type": "string", "format": "email"}, "URLField": {"type": "string", "format": "uri"},
    "CharField": {"type": "string"}, "ListField": {"type": "array"}, "DictField": {"type": "object"},
    "JSONField": {}, "Serializer": {"type": "object"},
}


def input_schema(definition) -> dict | None:
    """A JSON Schema of the input a workflow's `input` serializer accepts (its keyword arguments),
    or None when it declares none (or a callable, which has no fields to show)."""
    import inspect

    declared = definition.input
    if declared is None or not inspect.isclass(declared):
        return None
    serializer = declared()
    properties, required = {}, []
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        schema = _field_schema(field)
        if field.help_text:
            schema["description"] = str(field.help_text)
        properties[name] = schema
        if field.required:
            required.append(name)
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _field_schema(field) -> dict:
    choices = getattr(field, "choices", None)
    if choices:
        return {"enum": [str(value) for value in choices]}
    if hasattr(field, "fields") and not hasattr(field, "child"):  # a nested serializer
        return {"type": "object", "properties": {name: _field_schema(inner) for name, inner in field.fields.items()}}
    for cls in type(field).__mro__:
        if cls.__name__ in _FIELD_TYPES:
            schema = dict(_FIELD_TYPES[cls.__name__])
            child = getattr(field, "child", None)
            if schema.get("type") == "array" and child is not None:
                schema["items"] = _field_schema(child)
            if getattr(field, "allow_null", False):
                schema["nullable"] = True  # OpenAPI 3.0's spelling, as the API's schema uses
            return schema
    return {}


def unawaited_signal(workflow: str, name: str) -> str | None:
    """A warning if `workflow`'s shape never waits for the signal `name` (None if it does, or if
    the workflow is not registered here): such a signal is kept, in case a later version of the
    code waits for it, but nothing takes it now."""
    awaited = awaited_signals(workflow)
    if awaited is None:
        return None
    names, whole = awaited
    if name in names:
        return None
    waits = ", ".join(repr(n) for n in names) if names else "no signal"
    hedge = "" if whole else ", as far as its shape can be found without running it,"
    return (f"The workflow {workflow!r}{hedge} never waits for a signal {name!r} (it waits for {waits}); "
            f"the signal is kept in case a later version of the code waits for it.")
