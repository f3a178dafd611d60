"""The durable tables on a database of their own (DURABLE_DATABASE): what cannot be promised then.

A start inside ``transaction.atomic()`` commits or rolls back with the caller's transaction, and an
``atomic=True`` step's writes commit with its checkpoint, only when both are on one database. With
the durable tables apart, both would silently become "at least once" or "maybe": they are refused
with OtherDatabase instead, naming what to do.
"""

from __future__ import annotations

import re
from contextlib import ExitStack, contextmanager

from django.conf import settings
from django.db import connections

from .exceptions import OtherDatabase

# A statement that changes data or schema (a SELECT ... FOR UPDATE only reads).
_WRITE = re.compile(r"\s*(INSERT|UPDATE|DELETE|MERGE|UPSERT|REPLACE|CREATE|ALTER|DROP|TRUNCATE|COPY)\b", re.I)


def callers_transactions(db: str) -> list[str]:
    """The aliases other than `db` whose connection is inside a transaction.atomic() of the
    caller's (a test case's own blocks do not count)."""
    if len(settings.DATABASES) == 1:
        return []  # one database: nothing to look at (3 µs saved on every start)
    return [connection.alias for connection in connections.all(initialized_only=True)
            if connection.alias != db and connection.in_atomic_block
            and any(not block._from_testcase for block in connection.atomic_blocks)]


def refuse_other_transaction(db: str, what: str) -> None:
    """Raise OtherDatabase when `what` (a start) happens inside a transaction of another database
    than `db`, the durable one: it could not commit or roll back with it."""
    others = callers_transactions(db)
    if others:
        raise OtherDatabase(
            f"{what} inside a transaction of database {others[0]!r}, while the durable tables are on "
            f"{db!r} (DURABLE_DATABASE): the run could not commit or roll back with that transaction. "
            f"Start it after the commit (transaction.on_commit(lambda: durable.start(...))), outside "
            f"the transaction, or keep the durable tables on the same database.")


@contextmanager
def writes_only_to(db: str, key: str):
    """While an atomic=True step runs: a write to another database than `db` raises OtherDatabase
    before it is made (it would commit on its own, whatever became of the step)."""
    def refuse(execute, sql, params, many, context):
        if _WRITE.match(sql):
            alias = context["connection"].alias
            raise OtherDatabase(
                f"Step {key!r} is atomic=True, so its writes commit with its checkpoint on database {db!r} "
                f"(DURABLE_DATABASE); it wrote to database {alias!r}, which that transaction does not cover. "
                f"Make the step not atomic (and idempotent), or keep its data on {db!r}.")
        return execute(sql, params, many, context)

    if len(settings.DATABASES) == 1:
        yield
        return
    with ExitStack() as stack:
        for alias in settings.DATABASES:
            if alias != db:
                stack.enter_context(connections[alias].execute_wrapper(refuse))
        yield
