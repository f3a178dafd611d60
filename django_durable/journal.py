"""What the hot path writes to the journal: a step record and its columns, shared by both databases."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass


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
    # Not a column: the signal or event message this entry consumes, marked consumed in the
    # same statement that writes the entry.
    consumes: int | None = None

    @property
    def values(self) -> tuple:
        """The column values after run_id, in the order of STEP_COLUMNS."""
        return (self.key, self.seq, self.kind, self.name, self.status, self.result, self.error,
                self.attempts, self.started_at, self.finished_at, self.deadline_at, self.retry_at, self.match,
                self.remaining)


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
)
# A second write of a key replaces a running or retrying entry, never a final one: a recorded
# outcome is written at most once.
# A parallel group's count of unfinished branches is decremented by the branches themselves:
# a write that does not carry one keeps it. A wait that ends keeps the time it began.
_KEEP = {
    "remaining": 'COALESCE(EXCLUDED."remaining", durable_step."remaining")',
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
