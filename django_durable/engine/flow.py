"""Branches chosen once (switch), and what a run tells the world: notes, progress, emitted events.

Each is a journal entry, so a replay takes the same branch without asking the matchers again,
and writes, sends or delivers nothing twice. Notes and progress are buffered like a step's
result (they commit with the next checkpoint); an emitted event is delivered in the transaction
that records it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..ids import check_name
from .. import conf, serialization
from ..exceptions import NoBranchMatched
from ..retry import RetryPolicy

# An emitted event is delivered at once or tried again soon: it is one insert per waiting run.
_EMIT_RETRY = RetryPolicy(max_attempts=5, initial_backoff=0.5, max_backoff=10.0)


class Flow:
    def switch(self, key: str, value: Any, branches: Mapping[str, tuple[Any, Callable]],
               default: tuple[str, Callable] | Callable | None = None) -> Any:
        """Run the first branch whose matcher fits `value` and return its result, recorded under `key`.

        `branches` maps a branch id to ``(match, run)``: `match` is a callable given `value` (the
        branch fits when it returns something true) or a plain value (it fits when equal to
        `value`); `run(value)` runs the branch and may call steps, waits and everything else a
        workflow function can. `default` is ``(id, run)``, or just `run` (its id is "default"),
        taken when no branch fits. Matchers are tried in order.

        The id of the chosen branch is recorded before the branch runs: a replay goes down the
        same branch without asking the matchers again, and once the branch has returned, its
        result comes from the journal. Raise NoBranchMatched when nothing fits and there is no
        default (nothing is recorded), NonDeterminismError when the recorded branch is no longer
        among the branches.
        """
        self._claim_key(key, "ctx.switch()")
        choices = _choices(key, branches, default)
        entry = self._journal.get(key)
        if entry is not None:
            if entry.kind != "switch":
                self._check_same(key, entry, "switch", entry.name)
            if entry.status in ("completed", "failed"):
                return self._replay_final(key, entry)
            chosen = entry.name
            if chosen not in choices:
                raise self._diverge(
                    f"Switch {key!r} went down branch {chosen!r}, which the workflow code no longer has "
                    f"(its branches now: {', '.join(map(repr, choices))}). Restore the branch, or give "
                    f"the switch another key."
                )
        else:
            chosen = _choose(key, value, branches, default)
            self._record(key, chosen, "running", None, None, self._session.now(), 1, kind="switch")
        result = choices[chosen][1](value)
        text = serialization.encode(result, what=f"result of branch {chosen!r} of switch {key!r}",
                                    max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
        started = self._journal[key].started_at
        self._record(key, chosen, "completed", text, None, started, 1, kind="switch")
        return serialization.decode(text)

    def patched(self, change_id: str) -> bool:
        """True where this run goes down the code as changed by `change_id`; False where it
        replays history an earlier version of the code recorded past this point.

        A run that reaches this call for the first time since the change (a new run, or one that
        was waiting before this point) records a marker and gets True, now and on every replay. A
        run whose journal already holds entries the code has not reached yet went past this point
        under the old code: it gets False and records nothing, so it finishes on the old path::

            if ctx.patched("express-shipping"):
                ctx.step("ship", ship_express, order)
            else:
                ctx.step("ship-by-post", ship_by_post, order)

        Once no run that predates the change is left, drop the old branch; keep the call (or its
        marker's key, ``patch:<change_id>``) while runs that recorded it are in flight.
        """
        if not isinstance(change_id, str) or not change_id:
            raise ValueError(f"A change id is a non-empty string, not {change_id!r}.")
        key = f"patch:{change_id}"
        self._claim_key(key, "ctx.patched()")
        entry = self._journal.get(key)
        if entry is not None:
            self._check_same(key, entry, "patch", change_id)
            return True
        if any(seen not in self._used and recorded.kind != "progress" for seen, recorded in self._journal.items()):
            return False  # history from before the change, beyond this point: the old path
        self._record(key, change_id, "completed", "true", None, self._session.now(), 1, kind="patch")
        return True

    def note(self, message: str, **data: Any) -> None:
        """Add a note to the run's history: shown on its timeline in the admin, returned by the
        REST API, and sent as the ``run_noted`` signal once it has committed. A replay does not
        add it again. `data` must be JSON (with the supported extra types)."""
        if not isinstance(message, str) or not message:
            raise ValueError(f"A note is a non-empty string, not {message!r}.")
        key = self._next_key("note")
        if key in self._journal:
            return
        text = serialization.encode({"message": message, "data": data}, what="a note",
                                    max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
        self._record(key, "", "completed", text, None, self._session.now(), 1, kind="log")

    def set_progress(self, done: int | float, total: int | float | None = None, message: str = "") -> None:
        """Say how far the run has got ("3 of 10 files"): the run's progress, which the REST API
        and the admin show and a front end polls, sent as the ``run_progress`` signal once it has
        committed. It commits with the next checkpoint (before the next step starts, at the
        latest when the run waits or ends). A replay does not set an earlier progress again."""
        for name, number in (("done", done), ("total", total)):
            if number is not None and (isinstance(number, bool) or not isinstance(number, int | float)):
                raise TypeError(f"Progress {name} must be a number, not {number!r}.")
        if not isinstance(message, str):
            raise TypeError(f"A progress message is a string, not {message!r}.")
        count = self._counters.get("progress", 0) + 1
        self._counters["progress"] = count
        if count == 1:
            self._claim_key("progress", "ctx.set_progress()")  # one entry, kept up to date
        entry = self._journal.get("progress")
        if entry is not None and (serialization.decode(entry.result) or {}).get("n", 0) >= count:
            return  # replaying what was set before
        text = serialization.encode({"n": count, "done": done, "total": total, "message": message})
        # Kept `running` while the run goes on, so that each update replaces it in place; its
        # started_at is when it was last set.
        self._record("progress", "", "running", text, None, self._session.now(), 1, kind="progress")

    def write_stream(self, name: str, value: Any) -> None:
        """Append `value` (JSON) to the run's stream `name`: durable.read_stream(run_id, name) and
        GET /api/durable/workflows/{id}/stream/ give the values in order as they are written. Once
        per run, however often the code replays; written at once (not at the next checkpoint),
        so a reader sees each value while the run goes on."""
        self._stream_entry(name, {"value": value})

    def close_stream(self, name: str) -> None:
        """End the stream `name`: its readers stop after its last value (they stop anyway when
        the run ends)."""
        self._stream_entry(name, {"closed": True})

    def _stream_entry(self, name: str, body: dict) -> None:
        from ..workpool.wakeups import announce_stream

        check_name(name, "stream")
        key = self._next_key(f"stream:{name}")
        if key in self._journal:
            return
        text = serialization.encode(body, what=f"a value of the stream {name!r}", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
        self._record(key, name, "completed", text, None, self._session.now(), 1, kind="stream", write="now")
        announce_stream(self._session.claim.run_id, db=self._session.claim.db)

    def emit(self, name: str, payload: Any = None) -> int:
        """Tell the world `name` happened: the ``run_emitted`` Django signal, and the event `name`
        to every run waiting for it (as ``durable.emit_event()`` does). Once per run, however
        often the code replays: the delivery commits with its journal entry. Return how many
        runs took the event (recorded, so a replay returns the same number)."""

        check_name(name, "event")
        key = self._next_key(f"emit:{name}", claim=False)  # _step claims it
        outcome = self._step(key, _deliver, (name, payload), {}, atomic=True, retry=_EMIT_RETRY, timeout=None,
                             kind="emit", name=name)
        return outcome["delivered"]

    def _next_key(self, prefix: str, claim: bool = True) -> str:
        """`prefix`:0, :1, … in the order the code reaches them (claimed for this run, unless not `claim`)."""
        count = self._counters.get(prefix, 0)
        self._counters[prefix] = count + 1
        key = f"{prefix}:{count}"
        if claim:
            self._claim_key(key, f"ctx.{prefix}()")
        return key


def _deliver(name: str, payload: Any) -> dict:
    from ..workpool.messages import emit_event

    return {"payload": payload, "delivered": emit_event(name, payload)}


def _choices(key: str, branches, default) -> dict[str, tuple[Any, Callable]]:
    """The branches by id, with the default; TypeError for a malformed one."""
    if not isinstance(branches, Mapping):
        raise TypeError(f"switch {key!r}: branches map an id to (match, run), not {type(branches).__name__}.")
    choices = {}
    for branch, pair in branches.items():
        if not isinstance(branch, str) or not isinstance(pair, tuple) or len(pair) != 2 or not callable(pair[1]):
            raise TypeError(f"switch {key!r}: branch {branch!r} must be a string id mapped to (match, run).")
        choices[branch] = pair
    if default is not None:
        branch, run = ("default", default) if callable(default) else (default[0], default[1])
        if branch in choices:
            raise ValueError(f"switch {key!r}: the default's id {branch!r} is also a branch's.")
        choices[branch] = (None, run)
    return choices


def _choose(key: str, value: Any, branches, default) -> str:
    for branch, (match, _) in branches.items():
        if match(value) if callable(match) else match == value:
            return branch
    if default is None:
        raise NoBranchMatched(f"switch {key!r}: no branch fits {value!r} and there is no default.")
    return "default" if callable(default) else default[0]
