"""Which partition of the runs table a run falls in, where runs are partitioned (PostgreSQL).

The models stand on this (a run's `id_time` is filled in from its id, and a lookup by id names
its partitions), so it imports no model: the conversion and the partitions' upkeep are runs.py.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass

from .. import conf, ids
from ..ids import EPOCH
from . import tables

TABLE = "durable_workflow_run"


@dataclass(frozen=True)
class Layout(tables.Layout):
    """How the runs table is partitioned; a run's partition key is ids.id_time of its id."""

    def key(self, run_id: uuid.UUID) -> dt.datetime:
        return ids.id_time(run_id, self.since)


_layouts: dict[str, Layout | None] = {}


def layout(db: str | None = None, *, refresh: bool = False) -> Layout | None:
    """How the runs table on `db` is partitioned, or None (plain, or not PostgreSQL). Read once
    per process: restart the workers after converting."""
    db = db or conf.get("DATABASE")
    if refresh or db not in _layouts:
        found = tables.read_layout(db, TABLE)
        _layouts[db] = None if found is None else Layout(*found)
    return _layouts[db]


def key(run_id, db: str | None = None) -> dt.datetime:
    """The partition key (id_time) of run `run_id` on `db`: 1970 where runs are not partitioned."""
    shape = layout(db)
    if shape is None:
        return EPOCH
    return shape.key(run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id)))


def lookup(db: str | None, filters: dict) -> dict:
    """The id_time filter that names the partitions of the runs `filters` look up by id
    (pk=, id=, pk__in=, id__in=), or of the children of a run (parent_id=, parent=: a child's id
    carries its parent's time), or nothing: a plain table, or no such lookup. Many ids name the
    range of their times (a statement of one size, however many)."""
    shape = layout(db)
    if shape is None or any(name.startswith("id_time") for name in filters):
        return {}
    for name in ("parent_id", "parent"):
        if name in filters:
            given = getattr(filters[name], "pk", filters[name])
            found = _as_uuid(given)
            return {} if found is None else {"id_time": shape.key(found)}
    for name in ("pk", "id"):
        if name in filters:
            found = _as_uuid(filters[name])
            return {} if found is None else {"id_time": shape.key(found)}
        if f"{name}__in" in filters:
            given = filters[f"{name}__in"]
            if not isinstance(given, (list, tuple, set, frozenset)):
                return {}  # a subquery: its runs may be in any partition
            found = [_as_uuid(value) for value in given]
            if not found or None in found:
                return {}
            times = [shape.key(value) for value in found]
            return {"id_time__gte": min(times), "id_time__lte": max(times)}
    return {}


def _as_uuid(value) -> uuid.UUID | None:
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            return None  # the lookup itself says what is wrong with it
    return None
