"""The Context a workflow function receives: memoized steps and recorded values."""

from __future__ import annotations

import datetime as dt
import random as _random
import traceback
import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .. import clock, conf, faults, serialization
from ..exceptions import NonDeterminismError, StepFailed
from ..interrupts import LeaseLost, Preempted


@dataclass
class Entry:
    """A recorded journal entry, decoded only when replay reaches it."""

    seq: int
    kind: str
    name: str
    status: str
    result: str | None
    error: str | None


class Context:
    """What a workflow function gets as its first argument.

    Every call that has an effect outside the workflow function goes through the context, so
    that a replay after a crash gives the function exactly the values the first run saw.
    """

    def __init__(self, *, run_id, workflow: str, attempt: int, journal: dict[str, Entry], session):
        self.run_id = run_id
        self.workflow = workflow
        self.attempt = attempt
        self._journal = journal
        self._session = session
        self._next_seq = max((e.seq for e in journal.values()), default=0) + 1
        self._counters: dict[str, int] = {}
        self._used: set[str] = set()

    def __repr__(self) -> str:
        return f"<Context {self.workflow} run={self.run_id}>"

    # -- steps ----------------------------------------------------------------------------------

    def step(self, key: str, fn: Callable, /, *args: Any, atomic: bool = False, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once for this run and return its (recorded) result.

        When `key` is already recorded, return the recorded result without calling `fn`; a
        recorded failure raises StepFailed again. With ``atomic=True`` the step runs inside the
        database transaction that records it: its ORM writes and the checkpoint commit together.
        Raise StepFailed if `fn` raises, NonDeterminismError if `key` was recorded for another
        function, and NotSerializable if the result is not storable.
        """
        _check_key(key)
        if key in self._used:
            raise ValueError(
                f"Step key {key!r} is used twice in this run; keys must be unique within a run "
                f"(in a loop, put the index or the item's id in the key)."
            )
        self._used.add(key)
        name = _function_name(fn)
        entry = self._journal.get(key)
        if entry is not None:
            return self._replay(key, entry, "step", name)
        self._session.before_step()
        started = self._session.now()
        if faults.active:
            faults.hit("before_step_call", key)
        if atomic:
            return self._run_atomic(key, name, started, fn, args, kwargs)
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            self._record_failure(key, name, started, exc)
        if faults.active:
            faults.hit("after_step_return", key)
        text = self._encode_result(key, name, started, value)
        # Buffered: it commits before the next step starts, or with the run's outcome.
        self._record(key, "step", name, "completed", text, None, started)
        return serialization.decode(text)

    def _run_atomic(self, key, name, started, fn, args, kwargs):
        try:
            with transaction.atomic(using=self._session.db):
                try:
                    value = fn(*args, **kwargs)
                    if faults.active:
                        faults.hit("after_step_return", key)
                    text = self._encode(value, key)
                except Exception as exc:
                    raise _StepRaised from exc  # roll the step's writes back
                self._record(key, "step", name, "completed", text, None, started, now=True)
                if faults.active:
                    faults.hit("before_checkpoint_commit", key)
        except _StepRaised as raised:
            self._record_failure(key, name, started, raised.__cause__)
        if faults.active:
            faults.hit("after_checkpoint_commit", key)
        return serialization.decode(text)

    def _encode(self, value, key):
        return serialization.encode(
            value, what=f"result of step {key!r}", max_bytes=conf.get("MAX_PAYLOAD_BYTES")
        )

    def _encode_result(self, key, name, started, value):
        try:
            return self._encode(value, key)
        except Exception as exc:
            self._record_failure(key, name, started, exc)

    def _record_failure(self, key, name, started, exc: Exception):
        text = serialization.dumps_error(exc, "".join(traceback.format_exception(exc)))
        self._record(key, "step", name, "failed", None, text, started)
        raise StepFailed(key, serialization.decode(text)) from exc

    def _record(self, key, kind, name, status, result, error, started, *, now=False):
        seq = self._next_seq
        self._session.record(
            key=key, seq=seq, kind=kind, name=name, status=status, result=result, error=error,
            started_at=started, now=now,
        )
        self._next_seq = seq + 1
        self._journal[key] = Entry(seq, kind, name, status, result, error)

    def _replay(self, key: str, entry: Entry, kind: str, name: str) -> Any:
        if entry.kind != kind or (entry.name and name and entry.name != name):
            raise NonDeterminismError(
                f"Step {key!r} was recorded as a {entry.kind} of {entry.name or '?'} but the "
                f"workflow code now reaches it as a {kind} of {name}. The code changed under a "
                f"running workflow; restore it, or give the new call another key."
            )
        if entry.status == "failed":
            raise StepFailed(key, serialization.decode(entry.error))
        return serialization.decode(entry.result)

    # -- recorded values ------------------------------------------------------------------------

    def now(self) -> dt.datetime:
        """Return the current time, recorded: a replay returns the same value."""
        return self._note("now", lambda: self._session.now())

    def uuid(self) -> _uuid.UUID:
        """Return a random UUID (version 4), recorded: a replay returns the same value."""
        return self._note("uuid", _uuid.uuid4)

    def random(self) -> float:
        """Return a random float in [0, 1), recorded: a replay returns the same value."""
        return self._note("random", _random.random)

    def _note(self, what: str, make: Callable[[], Any]) -> Any:
        count = self._counters.get(what, 0)
        self._counters[what] = count + 1
        key = f"{what}:{count}"
        entry = self._journal.get(key)
        if entry is not None:
            return self._replay(key, entry, "note", what)
        text = serialization.encode(make())
        self._record(key, "note", what, "completed", text, None, self._session.now())
        return serialization.decode(text)


class _StepRaised(Exception):
    """Carries a step's own exception out of its atomic block, so the block rolls back."""


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > 255:
        raise ValueError(f"A step key must be a non-empty string of at most 255 characters, not {key!r}.")


def _function_name(fn: Callable) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return f"{module}.{name}"[:255] if module else name[:255]
