"""Named fault points for the fault tests; they cost one attribute check when off.

``DURABLE_FAULTS`` in the environment arms them: ``point=action[+action...][@step_key];...``.
Actions: ``exit`` (os._exit, like a crash), ``kill`` (SIGKILL to this process), ``raise``
(an OperationalError), ``sqlstate:CODE`` (make the database raise that error on this thread's
connection, e.g. 40001 or 40P01), ``terminate`` (pg_terminate_backend of this thread's
connection, from a second one), ``sleep:SECONDS``, ``touch:PATH`` (create a file, then go on),
``block:PATH`` (wait until a file exists), ``once:PATH`` (skip the remaining actions if the
file exists, else create it) and ``chance:P`` (go on with the remaining actions with probability
P, for random fault soaks). With ``@step_key`` the fault fires only at that step.

Points: after_claim_commit, before_step_call, after_step_return, before_checkpoint_commit,
after_checkpoint_commit, before_terminal_commit, after_terminal_commit (a run's end committed,
its reply not yet seen: ``raise`` there is a reply lost after COMMIT), after_heartbeat,
sweeper_after_select.
"""

from __future__ import annotations

import os
import signal
import time

POINTS = frozenset(
    {
        "after_claim_commit",
        "before_step_call",
        "after_step_return",
        "before_checkpoint_commit",
        "after_checkpoint_commit",
        "before_terminal_commit",
        "after_terminal_commit",
        "after_heartbeat",
        "sweeper_after_select",
    }
)

_armed: dict[str, list[tuple[list[str], str | None]]] = {}
active = False


def arm(spec: str) -> None:
    """Arm the faults described by `spec` (replacing any armed before); "" disarms all."""
    global active
    _armed.clear()
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        point, _, rest = part.partition("=")
        point = point.strip()
        if point not in POINTS:
            raise ValueError(f"Unknown fault point {point!r}; known points: {sorted(POINTS)}.")
        actions, _, key = rest.partition("@")
        _armed.setdefault(point, []).append((actions.split("+"), key or None))
    active = bool(_armed)


def hit(point: str, key: str | None = None) -> None:
    """Run the actions armed at `point` (for step `key`), if any."""
    for actions, only_key in _armed.get(point, ()):
        if only_key is None or only_key == key:
            for action in actions:
                if _perform(action, point) is False:
                    break


def _perform(action: str, point: str):
    name, _, arg = action.partition(":")
    if name == "once":
        if os.path.exists(arg):
            return False
        with open(arg, "a"):
            pass
    elif name == "chance":
        import random

        if random.random() >= float(arg):
            return False
    elif name == "sqlstate":
        import re

        from django.db import connections

        from . import conf

        if not re.fullmatch(r"[0-9A-Z]{5}", arg):
            raise ValueError(f"sqlstate needs a five-character SQLSTATE, not {arg!r}.")
        with connections[conf.get("DATABASE")].cursor() as cursor:
            cursor.execute(f"DO $$ BEGIN RAISE EXCEPTION 'fault injected at {point}' USING ERRCODE = '{arg}'; END $$")
    elif name == "terminate":
        from django.db import connections

        from . import conf

        alias = conf.get("DATABASE")
        victim = connections[alias]
        victim.ensure_connection()
        side = connections.create_connection(alias)
        try:
            with side.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [victim.connection.info.backend_pid])
        finally:
            side.close()
    elif name == "exit":
        os._exit(1)
    elif name == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif name == "raise":
        from django.db import OperationalError

        raise OperationalError(f"fault injected at {point}")
    elif name == "sleep":
        time.sleep(float(arg))
    elif name == "touch":
        with open(arg, "a"):
            pass
    elif name == "block":
        deadline = time.monotonic() + 600  # a test that never creates the file must not hang for ever
        while not os.path.exists(arg) and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        raise ValueError(f"Unknown fault action {action!r} at {point}.")


arm(os.environ.get("DURABLE_FAULTS", ""))
