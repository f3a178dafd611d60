"""What the hot path writes to the journal: a step record and its columns, shared by both databases."""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import uuid
from json.encoder import c_make_encoder, encode_basestring_ascii
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class StepRecord:
    """A journal entry to write: what a step (or a recorded value) produced."""

    key: str
    seq: int
    kind: str
    name: str
    status: str
    result: str | None
    error: str | None
    attempts: int
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    deadline_at: dt.datetime | None = None
    retry_at: dt.datetime | None = None
    match: str | None = None
    remaining: int | None = None
    fingerprint: str | None = None  # of the step's function and arguments (fingerprint())
    # Not a column: the signal or event message this entry consumes, marked consumed in the
    # same statement that writes the entry.
    consumes: int | None = None

    @property
    def values(self) -> tuple:
        """The column values after run_id, in the order of STEP_COLUMNS."""
        return (self.key, self.seq, self.kind, self.name, self.status, self.result, self.error,
                self.attempts, self.started_at, self.finished_at, self.deadline_at, self.retry_at, self.match,
                self.remaining, self.fingerprint)


# The journal's columns as the hot-path statements write them, with their PostgreSQL types.
STEP_COLUMNS = (
    ("run_id", "uuid"),
    ("key", "varchar"),
    ("seq", "integer"),
    ("kind", "varchar"),
    ("name", "varchar"),
    ("status", "varchar"),
    ("result", "text"),
    ("error", "text"),
    ("attempts", "integer"),
    ("started_at", "timestamptz"),
    ("finished_at", "timestamptz"),
    ("deadline_at", "timestamptz"),
    ("retry_at", "timestamptz"),
    ("match", "text"),
    ("remaining", "integer"),
    ("fingerprint", "varchar"),
)
# A second write of a key replaces a running or retrying entry, never a final one: a recorded
# outcome is written at most once.
# A parallel group's count of unfinished branches is decremented by the branches themselves:
# a write that does not carry one keeps it, and so does one without a fingerprint. A wait that
# ends keeps the time it began.
_KEEP = {
    "remaining": 'COALESCE(EXCLUDED."remaining", durable_step."remaining")',
    "fingerprint": 'COALESCE(EXCLUDED."fingerprint", durable_step."fingerprint")',
    "started_at": "CASE WHEN durable_step.status = 'waiting' THEN durable_step.started_at ELSE EXCLUDED.started_at END",
}
UPSERT = (
    "ON CONFLICT (run_id, key) DO UPDATE SET "
    + ", ".join(
        f'"{name}" = {_KEEP.get(name, f"EXCLUDED.{chr(34)}{name}{chr(34)}")}'
        for name, _ in STEP_COLUMNS if name not in ("run_id", "key", "seq")
    )
    + " WHERE durable_step.status NOT IN ('completed', 'failed')"
)
# The same on a partitioned journal, whose unique index holds the partition key too.
UPSERT_PARTITIONED = UPSERT.replace("ON CONFLICT (run_id, key)", "ON CONFLICT (run_id, key, run_created_at)", 1)


_NO_ARGUMENTS = "[[],{}]"


def _tagged(value):
    """The JSON of the extra types serialization stores (as it tags them); TypeError for others."""
    if isinstance(value, uuid.UUID):  # the commonest: a step given the run's id
        return {"__durable__": "uuid", "v": str(value)}
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return {"__durable__": type(value).__name__, "v": value.isoformat()}
    if isinstance(value, dt.timedelta):
        return {"__durable__": "timedelta", "v": [value.days, value.seconds, value.microseconds]}
    if isinstance(value, Decimal):
        return {"__durable__": "decimal", "v": str(value)}
    raise TypeError(type(value).__name__)


# The canonical text of a call's arguments, keys sorted, tuples as lists: json's C encoder made once
# (json.dumps() makes one per call, which costs more than the encoding of a few arguments).
if c_make_encoder is not None:
    _encoder = c_make_encoder(None, _tagged, encode_basestring_ascii, None, ":", ",", True, False, True)

    def _canonical(value) -> str:
        return "".join(_encoder(value, 0))
else:  # pragma: no cover - a Python without the C accelerator
    _canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=_tagged).encode


def fingerprint(name: str, fn: Callable | None, args, kwargs: dict) -> str | None:
    """A short hash of a call, the same in every process: the function's recorded `name` and the
    arguments as JSON (tuples as lists, dict keys sorted). None when an argument is not a value
    JSON can hold (an object, a set): such a call is checked by its function only.

    A replay that reaches a recorded step whose fingerprint differs calls it with other
    arguments than the first run did (Context._check_call). The function's body is not part of
    it: a fix inside a step's function changes nothing that was recorded.
    """
    if type(fn) is functools.partial:  # its function and bound arguments are part of the call
        inner = fn.func
        name = f"{name}:{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', type(inner).__name__)}"
        args, kwargs = (*fn.args, *args), {**fn.keywords, **kwargs}
    if not args and not kwargs:
        text = _NO_ARGUMENTS
    else:
        try:
            text = _canonical((args, kwargs))
        except (TypeError, ValueError, RecursionError):  # not JSON, keys of mixed types, a cycle
            return None
    return hashlib.blake2b(f"{name}\n{text}".encode(), digest_size=8).hexdigest()


def as_datetime(value) -> dt.datetime | None:
    """A journal time as a datetime: they come back as datetimes (SQLite, the ORM) or ISO strings (PostgreSQL's JSON)."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(value)
