"""Who holds PostgreSQL's cleanup horizon back (``durable health``, ``durable stats``, the admin's
overview, the metrics).

VACUUM removes no row version that a snapshot still open may see. The queue's tables write a few
versions a job, so while something holds an old snapshot their dead versions pile up, their index
scans walk them, and claims slow down. What holds it, oldest first:

- ``snapshot``: a session's open transaction or long query (``pg_stat_activity.backend_xmin``, or
  the transaction's own id once it wrote);
  ``idle in transaction`` when the session does nothing inside it (a forgotten ``BEGIN``);
- ``standby``: a replica with ``hot_standby_feedback`` whose queries hold it
  (``pg_stat_replication.backend_xmin``);
- ``slot``: a replication slot (``pg_replication_slots.xmin``), active or abandoned;
- ``prepared``: a prepared transaction never committed or rolled back (``pg_prepared_xacts``).

Each with its age (how long it has held the horizon, where PostgreSQL says; otherwise how many
transactions old its snapshot is) and who holds it. Nothing on SQLite.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

from django.db import connections

from . import conf

_SNAPSHOTS = """
    SELECT 'snapshot', pid, coalesce(nullif(application_name, ''), backend_type), usename::text,
           coalesce(host(client_addr), 'local'), state, coalesce(xact_start, query_start),
           extract(epoch FROM now() - coalesce(xact_start, query_start)), age(coalesce(backend_xmin, backend_xid))
      FROM pg_stat_activity
     WHERE coalesce(backend_xmin, backend_xid) IS NOT NULL AND pid <> pg_backend_pid()
       AND datname = current_database()
       AND backend_type IN ('client backend', 'walsender')
    UNION ALL
    SELECT 'standby', pid, application_name, usename::text, coalesce(host(client_addr), 'local'), state,
           backend_start, NULL, age(backend_xmin)
      FROM pg_stat_replication WHERE backend_xmin IS NOT NULL
    UNION ALL
    SELECT 'slot', active_pid, slot_name, slot_type, CASE WHEN active THEN 'active' ELSE 'inactive' END, NULL,
           NULL, NULL, age(xmin)
      FROM pg_replication_slots WHERE xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared', NULL, gid, owner::text, 'local', NULL, prepared,
           extract(epoch FROM now() - prepared), age(transaction)
      FROM pg_prepared_xacts WHERE database = current_database()
    ORDER BY 9 DESC
    LIMIT %s
"""


@dataclass(frozen=True)
class Holder:
    """One thing that holds the cleanup horizon back."""

    kind: str  # snapshot, standby, slot, prepared
    pid: int | None
    name: str  # the application's name, the slot's, the prepared transaction's gid
    user: str  # the role; a slot's type
    client: str  # the client's address, "local"; a slot's "active" or "inactive"
    state: str  # a session's state ("idle in transaction", "active")
    since: dt.datetime | None
    seconds: float | None  # how long it has held it, where known
    transactions: int  # how many transactions old its horizon is

    @property
    def idle_in_transaction(self) -> bool:
        return self.kind == "snapshot" and (self.state or "").startswith("idle in transaction")

    def describe(self) -> str:
        """Who holds it, in words, for a health check and the admin."""
        age = f"for {self.seconds:.0f} s" if self.seconds is not None else f"{self.transactions} transactions old"
        if self.kind == "snapshot":
            what = "a session idle in transaction" if self.idle_in_transaction else "an open transaction or query"
            return f"{what} (pid {self.pid}, {self.name!r}, user {self.user}, from {self.client}) {age}"
        if self.kind == "standby":
            return f"a standby with hot_standby_feedback (pid {self.pid}, {self.name!r}, from {self.client}) {age}"
        if self.kind == "slot":
            return f"the {self.client} replication slot {self.name!r} ({self.user}) {age}"
        return f"the prepared transaction {self.name!r} (owner {self.user}) {age}"

    def as_dict(self) -> dict:
        data = asdict(self)
        data["since"] = self.since.isoformat() if self.since else None
        data["detail"] = self.describe()
        return data


def holders(db: str | None = None, limit: int = 5) -> list[Holder]:
    """What holds the horizon of `db` (DURABLE_DATABASE) back, oldest first; [] where not PostgreSQL."""
    connection = connections[db or conf.get("DATABASE")]
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(_SNAPSHOTS, [limit])
        rows = cursor.fetchall()
    return [Holder(kind, pid, name or "", user or "", client or "", state or "", since,
                   None if seconds is None else float(seconds), int(transactions or 0))
            for kind, pid, name, user, client, state, since, seconds, transactions in rows]


def held_too_long(found: list[Holder], max_seconds: float, max_transactions: int) -> list[Holder]:
    """Those of `found` that hold the horizon longer than `max_seconds`, or (where no time is
    known) more than `max_transactions` transactions back."""
    return [holder for holder in found
            if (holder.seconds > max_seconds if holder.seconds is not None else holder.transactions > max_transactions)]
