"""The workflow context's contract: what a workflow function may call, and what a context asks of its session.

``WorkflowContext`` is every public method and attribute of the Context a workflow function gets.
Each stand-in that runs workflow code in its place implements all of it, or refuses a method
with a named reason (``Refused``): describe's Recorder, which records a shape and runs nothing.
``Session`` is what a Context asks of the advance that drives it; the replay check's session
(replaycheck._Session) stands in for the worker's (replay.Session). The type checker holds the
implementations to both (``make test`` runs mypy on this module), and tests/test_context_contract.py
lists the Context's public methods and fails when a stand-in lacks one: a new context method cannot
leave the shape, the checks built on it or the replay check blind.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import DurableError

if TYPE_CHECKING:
    from ..journal import StepRecord


class Refused(DurableError):
    """A stand-in of the context does not do this (the message says which and why)."""


class WorkflowContext(Protocol):
    """What a workflow function may call on its first argument."""

    run_id: Any
    workflow: str
    attempt: int

    @property
    def cancel_requested(self) -> bool: ...

    # steps and recorded values
    def step(self, key: str, fn: Callable, /, *args: Any, atomic: bool = False, retry: Any = None,
             timeout: Any = None, compensate: Callable | None = None, cancellable: bool = True,
             **kwargs: Any) -> Any: ...

    async def astep(self, key: str, fn: Callable, /, *args: Any, **kwargs: Any) -> Any: ...

    def now(self) -> Any: ...

    def uuid(self) -> Any: ...

    def random(self) -> Any: ...

    # waits
    def sleep(self, key: str, duration: float | dt.timedelta) -> None: ...

    def sleep_until(self, key: str, when: dt.datetime) -> None: ...

    def wait_for_signal(self, name: str, timeout: Any = None, *, key: str | None = None) -> Any: ...

    def wait_for_update(self, name: str, timeout: Any = None, *, key: str | None = None) -> Any: ...

    def wait_for_event(self, name: str, match: dict | None = None, timeout: Any = None, *, key: str | None = None,
                       since: dt.datetime | None = None) -> Any: ...

    def wait_for_approval(self, key: str, *, approvers: Any, timeout: Any = None, quorum: int = 1,
                          message: str = "", data: dict | None = None) -> Any: ...

    # branching and telling
    def switch(self, key: str, value: Any, branches: Mapping[str, tuple[Any, Callable]],
               default: Any = None) -> Any: ...

    def patched(self, change_id: str) -> bool: ...

    def note(self, message: str, **data: Any) -> None: ...

    def set_progress(self, done: int | float, total: int | float | None = None, message: str = "") -> None: ...

    def write_stream(self, name: str, value: Any) -> None: ...

    def close_stream(self, name: str) -> None: ...

    def emit(self, name: str, payload: Any = None) -> Any: ...

    # composition
    def call(self, key: str, fn: Callable, /, *args: Any, retry: Any = None, timeout: Any = None,
             cancellable: bool = True, **kwargs: Any) -> Any: ...

    def map(self, key: str, fn: Callable, items: Iterable, *, retry: Any = None, timeout: Any = None,
            return_exceptions: bool = False, cancellable: bool = True) -> list: ...

    def parallel(self, calls: list, *, key: str | None = None, return_exceptions: bool = False) -> list: ...

    def start_child(self, key: str, workflow: str | Callable, /, *args: Any, detached: bool = False,
                    **kwargs: Any) -> Any: ...

    def child(self, key: str, workflow: str | Callable, /, *args: Any, **kwargs: Any) -> Any: ...

    def rollback(self) -> None: ...


class Session(Protocol):
    """What a Context asks of the advance that drives it: the journal's writes, the run's
    messages and children, the clock, and the alarm that bounds a step."""

    claim: Any
    db: str
    deadline: dt.datetime | None
    rolling_back: bool
    event_waits: dict

    def now(self) -> dt.datetime: ...

    def passed(self, when: dt.datetime) -> bool: ...

    def before_step(self, key: str, running: StepRecord | None = None) -> None: ...

    def record(self, record: StepRecord, now: bool = False, derivable: bool = False) -> None: ...

    def take_message(self, kind: str, name: str, key: str, before: dt.datetime | None = None) -> Any: ...

    def take_stored_event(self, key: str, name: str, match: str, since: Any) -> Any: ...

    def open_approval(self, key: str, spec: dict, quorum: int, message: str, data: str, deadline: Any) -> None: ...

    def start_child(self, child_id: uuid.UUID, definition: Any, args: Any, kwargs: Any, detached: bool = False,
                    legacy_id: Any = None) -> Any: ...

    def finished_child(self, child_id: Any) -> Any: ...

    def committed(self, records: list) -> None: ...

    def attempt_failed(self, key: str, error: str, attempt: int) -> None: ...

    @property
    def alarm(self) -> Callable[..., Any]:
        """(deadline, key, *, cancellable=True): a context manager bounding a step's user code."""
        ...


if TYPE_CHECKING:  # what the type checker holds to the contracts (replaycheck.py holds its session)
    from .context import Context
    from .describe import Recorder
    from .replay import Session as AdvanceSession

    def _context(context: Context) -> WorkflowContext:
        return context

    def _recorder(recorder: Recorder) -> WorkflowContext:
        return recorder

    def _session(session: AdvanceSession) -> Session:
        return session
