"""Time partitions on PostgreSQL (optional): the journal, and then the runs table, in partitions
of a day, a week or a month, so that old history leaves by DROP, not DELETE.

- journal.py: ``PartitionJournal`` and the journal's partitions (by its run's creation time);
- runs.py: ``PartitionRuns`` and the runs table's partitions (by the time in the run's id);
- keys.py: which partition a run falls in (the models stand on it, so it imports none);
- tables.py: what both share.

``maintain()`` (``manage.py durable partitions maintain``, every worker's start-up and the
built-in ``durable.prune``) makes both tables' partitions ahead, drops the journal's past
partitions whose runs are all gone, and ANALYZEs the parents. The runs' partitions are dropped by
the prune, which knows each workflow's retention (retention.py).
"""

from __future__ import annotations

import datetime as dt

from .. import conf
from . import journal, runs, tables
from .journal import (
    Layout,
    PartitionJournal,
    convert,
    delete_runs,
    droppable,
    drop,
    ensure_ahead,
    entry_fields,
    layout,
    partitions,
)
from .runs import PartitionRuns
from .tables import INTERVALS, Partition

__all__ = [
    "INTERVALS", "Layout", "Partition", "PartitionJournal", "PartitionRuns", "convert", "delete_runs", "drop",
    "droppable", "ensure_ahead", "entry_fields", "journal", "layout", "maintain", "make_ahead", "partitions", "runs",
    "tables",
]


def make_ahead(db: str | None = None, ahead: int = 3) -> list[str]:
    """Make the partitions of both tables ahead (where partitioned); return the names made."""
    return journal.ensure_ahead(db, ahead) + runs.ensure_ahead(db, ahead)


def maintain(db: str | None = None, ahead: int = 3, drop_empty: bool = True, now: dt.datetime | None = None) -> dict:
    """Make partitions ahead, drop the journal's empty past ones, ANALYZE the parents; what was
    done. (`now` moves the clock droppable() judges by: for tests.)"""
    db = db or conf.get("DATABASE")
    if journal.layout(db) is None:
        return {"made": [], "dropped": []}
    made = make_ahead(db, ahead)
    dropped = []
    if drop_empty:
        for partition in droppable(db, now=now):
            drop(partition, db)
            dropped.append(partition.name)
    tables.analyze(db, journal.TABLE)
    if runs.layout(db) is not None:
        tables.analyze(db, runs.TABLE)
    return {"made": made, "dropped": dropped}
