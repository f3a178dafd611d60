"""durable.describe(): the static shape of a workflow, found by running its code against a recorder.

The workflow function runs once with a context that records each call (a step, a sleep, a wait,
a switch, a fan-out, a child, an emitted event) and runs nothing: no step function, no branch
function, no child. What the code would get back (a step's result, a signal's payload, the
workflow's own arguments) is an `Unknown` stand-in, which code can index, call, compare and
iterate. So the shape is what the code does for "some" data:

- a loop over data runs once (an Unknown iterates as one item), and a key built from data shows
  ``*`` where the data would be (``copy:*``): read it as "for each item";
- an ``if`` on data takes its true side; ``ctx.switch()`` records every branch (each is explored);
- code that fails on a stand-in (``int(result) + 1`` works, ``datetime.fromisoformat(result)``
  does not) ends the shape there with a ``stop`` node saying why.
"""

from __future__ import annotations

import copy
import datetime as dt
import inspect
import threading
import uuid
from functools import lru_cache
from typing import NamedTuple

from .. import registry
from .asyncs import call_workflow
from .composition import Call


_guesses = threading.local()  # how often the describing run let a stand-in decide (an if, a comparison)


def _guess() -> None:
    _guesses.count = getattr(_guesses, "count", 0) + 1


class Problem(NamedTuple):
    """What a run of a shape would fail on; `certain` unless reaching it took a guess about data."""

    message: str
    certain: bool


class Unknown:
    """A value the describing run cannot know (a step's result, an input): every use gives another."""

    def __init__(self, origin: str = "data"):
        self._origin = origin

    def __repr__(self) -> str:
        return f"<{self._origin}>"

    def __str__(self) -> str:
        return "*"

    def __format__(self, spec: str) -> str:
        return "*"

    def __getattr__(self, name: str) -> Unknown:
        if name.startswith("__"):
            raise AttributeError(name)
        return Unknown(self._origin)

    def __getitem__(self, key) -> Unknown:
        return Unknown(self._origin)

    def __call__(self, *args, **kwargs) -> Unknown:
        return Unknown(self._origin)

    def __iter__(self):
        yield Unknown(self._origin)  # a loop over data runs once

    def __len__(self) -> int:
        return 1

    def __bool__(self) -> bool:
        _guess()
        return True

    def __contains__(self, item) -> bool:
        _guess()
        return True

    def __int__(self) -> int:
        return 1

    def __float__(self) -> float:
        return 1.0

    def __index__(self) -> int:
        return 1

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other) -> bool:
        _guess()
        return True

    def __ne__(self, other) -> bool:
        _guess()
        return True

    def _same(self, *args) -> Unknown:
        return Unknown(self._origin)

    __lt__ = __le__ = __gt__ = __ge__ = _same
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _same
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _same
    __neg__ = __pos__ = __abs__ = _same


class Recorder:
    """Stands in for Context while describe() runs a workflow function: records, runs nothing."""

    def __init__(self, workflow: str):
        self.workflow = workflow
        self.run_id = uuid.UUID(int=0)
        self.attempt = 1
        self.nodes: list[dict] = []
        self.problems: list[Problem] = []  # what a run of this shape would fail on
        self.stopped: str | None = None  # why the describing run stopped before the code's end, first reason
        self._counters: dict[str, int] = {}
        self._uses: dict[str, str] = {}  # key -> what took it, on the path being described
        self._guesses_before = getattr(_guesses, "count", 0)

    def _use(self, key, what: str) -> None:
        """Take `key` for `what`, as a run would: the same key taken twice is a clash the run would
        fail on when it reaches the second. Keys built from data (with ``*``) may differ at run
        time, so only whole keys are compared."""
        key = str(key)
        first = self._uses.get(key)
        if first is None:
            self._uses[key] = what
        elif "*" not in key:
            guessed = getattr(_guesses, "count", 0) > self._guesses_before
            where = " (on the path where the conditions on data before it hold)" if guessed else ""
            self.problems.append(Problem(
                f"The key {key!r} is used by {first} and by {what}: a run fails when it reaches the second"
                f"{where}. Rename one (in a loop, put the index or the item's id in the key).", not guessed))

    def _auto(self, prefix: str) -> str:
        count = self._counters.get(prefix, 0)
        self._counters[prefix] = count + 1
        return f"{prefix}:{count}"

    # -- steps and recorded values ----------------------------------------------------------------

    async def astep(self, key, fn, /, *args, **kwargs):
        return self.step(key, fn, *args, **kwargs)

    def step(self, key, fn, /, *args, atomic=False, retry=None, timeout=None, compensate=None, cancellable=True,
             **kwargs):
        node = {"type": "step", "key": str(key), "function": _name(fn)}
        if atomic:
            node["atomic"] = True
        if retry is not None:
            node["max_attempts"] = retry.max_attempts
        node.update(_timeout(timeout))
        if compensate is not None:
            node["compensate"] = _name(compensate)
        self._use(key, f"ctx.step() of {node['function']}")
        self.nodes.append(node)
        return Unknown(f"result of {key}")

    def now(self):
        return Unknown("now")

    def uuid(self):
        return Unknown("uuid")

    def random(self):
        return Unknown("random")

    @property
    def cancel_requested(self) -> bool:
        return False

    # -- waits ------------------------------------------------------------------------------------

    def sleep(self, key, duration):
        self._use(key, "ctx.sleep()")
        seconds = _seconds(duration)
        self.nodes.append({"type": "sleep", "key": str(key), **({} if seconds is None else {"seconds": seconds})})

    def sleep_until(self, key, when):
        self._use(key, "ctx.sleep_until()")
        self.nodes.append({"type": "sleep", "key": str(key)})

    def wait_for_signal(self, name, timeout=None, *, key=None):
        self._use(key or self._auto(f"signal:{name}"), f"ctx.wait_for_signal({str(name)!r})")
        self.nodes.append({"type": "signal", "name": str(name), **_timeout(timeout)})
        return Unknown(f"signal {name}")

    def wait_for_update(self, name, timeout=None, *, key=None):
        self._use(key or self._auto(f"update:{name}"), f"ctx.wait_for_update({str(name)!r})")
        self.nodes.append({"type": "update", "name": str(name), **_timeout(timeout)})
        return _DescribedUpdate(name)

    def wait_for_event(self, name, match=None, timeout=None, *, key=None, since=None):
        self._use(key or self._auto(f"event:{name}"), f"ctx.wait_for_event({str(name)!r})")
        node = {"type": "event", "name": str(name)}
        if match:
            node["match"] = sorted(str(field) for field in match)
        self.nodes.append({**node, **_timeout(timeout)})
        return Unknown(f"event {name}")

    def wait_for_approval(self, key, *, approvers, timeout=None, quorum=1, message="", data=None):
        self._use(key, "ctx.wait_for_approval()")
        problem = _unknown_permission(approvers)
        if problem:
            self.problems.append(Problem(problem, True))
        node = {"type": "approval", "key": str(key), "approvers": _approvers_text(approvers),
                "quorum": quorum if type(quorum) is int else "?"}
        self.nodes.append({**node, **_timeout(timeout)})
        return Unknown(f"approval {key}")

    def part(self, node: dict, *, key: str, what: str, approvals: dict | None = None, timeout=None) -> None:
        """Record a part an integration runs as one node (an agent's loop: see
        django_durable.contrib.agent_runs), taking the keys `key` (``*`` for a count) for `what`.
        `approvals` maps each approval it may open to its approvers, checked as
        ctx.wait_for_approval()'s; None for approvers not given, which a run fails on when it
        reaches them."""
        self._use(key, what)
        shown = []
        for name, approvers in (approvals or {}).items():
            if approvers is None:
                self.problems.append(Problem(f"The {node['type']}'s {name!r} needs approval and no approvers were "
                                             f"given for it: a run fails when it asks.", False))
            elif problem := _unknown_permission(approvers):
                self.problems.append(Problem(problem, True))
            shown.append({"name": str(name), "approvers": "none given" if approvers is None
                          else _approvers_text(approvers), **_timeout(timeout)})
        self.nodes.append({**node, "approvals": shown} if shown else node)

    # -- branching and telling ----------------------------------------------------------------------

    def switch(self, key, value, branches, default=None):
        explored = []
        choices = [(branch, pair[1]) for branch, pair in dict(branches).items()]
        if default is not None:
            choices.append(("default", default) if callable(default) else (default[0], default[1]))
        self._use(key, "ctx.switch()")
        for branch, run in choices:
            explored.append({"id": str(branch), "shape": self._nested(lambda run=run: run(value))})
        self.nodes.append({"type": "switch", "key": str(key), "branches": explored})
        return Unknown(f"switch {key}")

    def patched(self, change_id):
        self._use(f"patch:{change_id}", "ctx.patched()")
        return True  # the shape of the code as it is now

    def note(self, message, **data):
        pass  # a note is not part of the shape

    def set_progress(self, done, total=None, message=""):
        if "progress" not in self._uses:  # one entry, however often it is set
            self._use("progress", "ctx.set_progress()")

    def write_stream(self, name, value):
        self._stream(name, "stream")

    def close_stream(self, name):
        self._stream(name, "close")

    def _stream(self, name, what: str) -> None:
        # One journal entry per write, keyed as the context keys them (stream:<name>:0, :1, ...),
        # and one node per stream, however often the code writes to it (a loop of tokens).
        self._use(self._auto(f"stream:{name}"), f"ctx.{'write' if what == 'stream' else 'close'}_stream({str(name)!r})")
        node = {"type": what, "name": str(name)}
        if node not in self.nodes[-1:]:
            self.nodes.append(node)

    def emit(self, name, payload=None):
        self._use(self._auto(f"emit:{name}"), f"ctx.emit({str(name)!r})")
        self.nodes.append({"type": "emit", "name": str(name)})
        return Unknown(f"emit {name}")

    # -- composition ------------------------------------------------------------------------------

    def call(self, key, fn, /, *args, retry=None, timeout=None, cancellable=True, **kwargs):
        return Call(str(key), fn, args, kwargs, retry, None, cancellable)

    def map(self, key, fn, items, *, retry=None, timeout=None, return_exceptions=False, cancellable=True):
        # How many branches: known at run time only (a describing run sees one item of any data).
        self._use(key, "ctx.map()")
        self.nodes.append({"type": "map", "key": str(key), "function": _name(fn)})
        return [Unknown(f"branch of {key}")]

    def parallel(self, calls, *, key=None, return_exceptions=False):
        calls = list(calls)
        self._use(key or self._auto("parallel:"), "ctx.parallel()")
        for call in calls:
            if isinstance(call, Call):
                self._use(call.key, f"a branch of ctx.parallel() ({_name(call.fn)})")
        self.nodes.append({"type": "parallel", "key": str(key or "parallel"),
                           "branches": [{"key": c.key, "function": _name(c.fn)} for c in calls if isinstance(c, Call)]})
        return [Unknown(f"branch {c.key}") for c in calls if isinstance(c, Call)]

    def start_child(self, key, workflow, /, *args, detached=False, **kwargs):
        definition = getattr(workflow, "durable_workflow", None) if callable(workflow) else registry.find(workflow)
        name = definition.name if definition is not None else (workflow if isinstance(workflow, str) else _name(workflow))
        node = {"type": "child", "key": str(key), "workflow": name}
        self._use(key, f"ctx.start_child() of {name}")
        if detached:
            node["detached"] = True
        self.nodes.append(node)
        return _Handle(key)

    def child(self, key, workflow, /, *args, **kwargs):
        self.start_child(key, workflow, *args, **kwargs)
        return Unknown(f"child {key}")

    def rollback(self):
        self.nodes.append({"type": "rollback"})

    # -- running ----------------------------------------------------------------------------------

    def _nested(self, run) -> list[dict]:
        # A branch of a switch is one path: its keys clash with those before the switch, not
        # with a sibling branch's.
        outer, self.nodes = self.nodes, []
        uses, self._uses = self._uses, dict(self._uses)
        try:
            _run(self, run)
            return self.nodes
        finally:
            self.nodes, self._uses = outer, uses


class _Handle:
    def __init__(self, key):
        self.key = key

    def result(self):
        return Unknown(f"child {self.key}")


def _run(recorder: Recorder, call) -> None:
    """Run `call`, ending the shape with a `stop` node where the code fails on a stand-in."""
    try:
        call()
    except Exception as exc:  # the code could not go on with "some" data: say where and why
        reason = f"{type(exc).__name__}: {exc}"[:300]
        recorder.nodes.append({"type": "stop", "reason": reason})
        if recorder.stopped is None:
            recorder.stopped = reason


def problems(workflow) -> list[Problem]:
    """What a run of `workflow` would fail on, found in its shape (see describe())."""
    definition = registry.get(workflow)
    return [] if definition.kind == "task" else _recorded(definition.fn, definition.name).problems


def stopped(workflow) -> str | None:
    """Why describing `workflow` stopped before its code's end (None: it did not): past that point
    its shape, and every check built on it, sees nothing."""
    definition = registry.get(workflow)
    return None if definition.kind == "task" else _recorded(definition.fn, definition.name).stopped


def describe(workflow, /, **input) -> dict:
    """The static shape of a registered workflow (a name or the function), as JSON-ready data.

    ``{"workflow", "description", "shape": [nodes in order], "problems": [messages]}``: what a run
    would fail on, found without one (a key two calls take; approvers naming a permission no
    model declares). Each node has a ``type`` (step,
    sleep, signal, event, update, switch, map, parallel, child, emit, stream, close, rollback, stop; a task's one node
    is a ``call``) and what is known of it. No step, branch or child runs: see this module's docstring for what a shape can and
    cannot show.

    ``input``: the workflow's keyword arguments for this shape (the shape of a run started with
    them: a branch on them goes their way); a parameter not given takes its default, and one with
    no default stands for "some" data. An argument the workflow does not take raises InvalidArguments.
    """
    definition = registry.get(workflow)
    if definition.kind == "task":  # one call of the task's function, retried as a whole
        function = definition.fn.task.func
        return {"workflow": definition.name, "kind": "task", "description": inspect.getdoc(function) or "",
                "shape": [{"type": "call", "function": _name(function)}], "problems": []}
    if input:
        recorder = Recorder(definition.name)
        code = getattr(definition.fn, "__wrapped__", definition.fn)
        arguments = _stand_ins(code, input)
        _run(recorder, lambda: call_workflow(code, recorder, arguments["args"], arguments["kwargs"]))
    else:
        recorder = _recorded(definition.fn, definition.name)
    # A copy: the recording is shared (_recorded), and a caller may edit what it gets.
    return {"workflow": definition.name, "kind": definition.kind, "description": inspect.getdoc(definition.fn) or "",
            "shape": copy.deepcopy(recorder.nodes), "problems": [problem.message for problem in recorder.problems]}


@lru_cache(maxsize=1024)
def _recorded(fn, name: str) -> Recorder:
    """The Recorder that ran the workflow function `fn` once, with its defaults: a process's code
    does not change under it, so the system checks, the catalog, the admin and the API share one
    recording (keyed by the function, so a workflow registered anew under the same name is
    recorded anew)."""
    recorder = Recorder(name)
    code = getattr(fn, "__wrapped__", fn)
    arguments = _stand_ins(code)
    _run(recorder, lambda: call_workflow(code, recorder, arguments["args"], arguments["kwargs"]))
    return recorder


def _stand_ins(fn, given: dict | None = None) -> dict:
    """The arguments of a describing run, for each parameter after the context: the value given,
    else its default, else an Unknown (none for *args and **kwargs, unless given)."""
    from ..exceptions import InvalidArguments

    given = dict(given or {})
    try:
        parameters = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return {"args": [], "kwargs": given}
    args, kwargs, takes_more = [], {}, False
    for parameter in parameters:
        if parameter.kind is parameter.VAR_KEYWORD:
            takes_more = True
            continue
        if parameter.kind is parameter.VAR_POSITIONAL:
            continue
        if parameter.name in given and parameter.kind is not parameter.POSITIONAL_ONLY:
            kwargs[parameter.name] = given.pop(parameter.name)
            continue
        value = Unknown(parameter.name) if parameter.default is parameter.empty else parameter.default
        if parameter.kind is parameter.POSITIONAL_ONLY:
            args.append(value)
        else:
            kwargs[parameter.name] = value
    if given and not takes_more:
        raise InvalidArguments(f"The workflow takes no argument {', '.join(map(repr, sorted(given)))}.")
    kwargs.update(given)
    return {"args": args, "kwargs": kwargs}


class _DescribedUpdate:
    """The update a describing run takes: its payload is data; answering it records nothing."""

    def __init__(self, name):
        self.name, self.id, self.payload = str(name), "*", Unknown(f"update {name}")

    def answer(self, value=None) -> None:
        pass

    def reject(self, reason="") -> None:
        pass


def _seconds(value) -> float | None:
    """A duration the shape can show (a number of seconds or a timedelta), else None."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _timeout(value) -> dict:
    """A wait's timeout in its node: its seconds where known (an input's default), True where it
    comes from data, nothing without one."""
    if value is None:
        return {}
    seconds = _seconds(value)
    return {"timeout": True if seconds is None else seconds}


def _name(fn) -> str:
    if isinstance(fn, Unknown):
        return "*"
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module}.{name}" if module else name


def _unknown_permission(approvers) -> str | None:
    """What is wrong with approvers naming a permission that no model of an installed app declares."""
    from ..approvers import approvers_spec, declared_permission

    try:
        permission = approvers_spec(approvers).get("permission")
    except (ValueError, TypeError):
        return None  # built from data, or refused when the approval opens
    if permission is None or declared_permission(permission):
        return None
    return (f"approvers={permission!r} names a permission no model declares (its default permissions and "
            f"Meta.permissions): nobody but a superuser could decide it. Check the spelling, or declare it.")


def _approvers_text(approvers) -> str:
    """Who may decide an approval, for a shape: the permission or group, or "users"."""
    try:
        from ..approvers import approvers_spec

        spec = approvers_spec(approvers)
    except (ValueError, TypeError):
        return "?"
    kind, value = next(iter(spec.items()))
    return f"{kind} {value}" if isinstance(value, str) else f"{len(value)} users"
