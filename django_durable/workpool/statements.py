"""Sending a hot statement on PostgreSQL: prepared on its connection, its placeholders numbered once,
in a pipeline with the statements of its transaction; the plumbing under postgres.py's verbs.
"""

from __future__ import annotations

import logging
import secrets
import weakref

from django.db import DatabaseError, connections, transaction

from .. import conf, partitioning

logger = logging.getLogger("django_durable.worker")

# Set to False after a pooler refused a prepared statement (PgBouncer in transaction mode
# before 1.21 loses them between transactions); then every statement is sent plain.
_prepare = True


def _cursor(db: str, sql: str):
    """A cursor for a hot-path statement, the statement's text for it, and whether the caller closes
    the cursor after it (else it is the connection's own, kept for its next statement); prepared
    on PostgreSQL after its first uses.

    Parsing and planning these statements costs more than executing them. Django's cursors bind
    parameters client-side and never prepare, so user code in the worker is unaffected; this
    one cursor binds server-side on the same connection and session (an atomic step's
    checkpoint joins the step's transaction); it keeps Django's wrapper and its error translation
    (below). It is a RawCursor, given the statement with its
    placeholders numbered once (`_numbered`): psycopg converts `%s` again at every execution
    of a statement longer than 4 KB, which most of these are. Making a cursor and Django's wrapper
    around it cost a tenth of a start: each connection keeps one of each kind (`_kept`).
    """
    connection = connections[db]
    # While Django logs queries (DEBUG, or a test counting them) the statements go unprepared:
    # the log of a prepared statement's execution has no SQL to show.
    if not (_prepare and conf.get("PREPARED_STATEMENTS")) or connection.queries_logged:
        return connection.cursor(), sql, True
    import psycopg

    connection.ensure_connection()
    raw = connection.connection
    if raw not in _named and not _unique_names(raw):
        return connection.cursor(), sql, True
    if raw.prepare_threshold is None:
        raw.prepare_threshold = 2
    if raw not in _generic and partitioning.runs.layout(db) is not None and _idle(raw):
        # With partitioned runs a statement given its run's partition as a parameter leaves the
        # others out before it starts, in a plan made once. Left to choose, PostgreSQL would plan
        # it again at every execution (a plan for those values looks cheaper than one for any):
        # measured, the checkpoint at half the speed. Only prepared statements follow this
        # setting, and only these are prepared on this connection (Django's bind client-side).
        raw.execute("SET plan_cache_mode = force_generic_plan")
        _generic.add(raw)
    numbered = _numbered(sql)
    kept = _kept.get(raw)
    if kept is None:
        kept = _kept[raw] = {}
    cursor = kept.get(numbered is None)
    if cursor is None or cursor.closed:
        made = psycopg.Cursor(raw) if numbered is None else psycopg.RawCursor(raw)
        made.format = psycopg.pq.Format.BINARY  # its rows read without parsing text: _binary_formats()
        cursor = kept[numbered is None] = connection._prepare_cursor(made)
    # The psycopg cursor itself, past the wrapper's layers (a sixth of a short statement's CPU):
    # execute() and in_transaction() do what the wrapper does. With execute wrappers installed,
    # the wrapper, so that they see the statement.
    return cursor if connection.execute_wrappers else cursor.cursor, sql if numbered is None else numbered, False


# Each connection's cursors for the hot statements (a psycopg Cursor for a statement with a `%`
# of its own, else a RawCursor), in Django's wrapper: made at its first statement, gone with it.
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# The connections set to force_generic_plan (the setting lasts as long as the session).
_generic: weakref.WeakSet = weakref.WeakSet()

# The connections whose prepared statements have names of their own (_unique_names).
_named: weakref.WeakSet = weakref.WeakSet()


def _unique_names(raw) -> bool:
    """Give the prepared statements of `raw` names no other connection uses; False if psycopg
    no longer lets us (then nothing is prepared on it).

    psycopg names them _pg3_0, _pg3_1, … on every connection. Behind a transaction pooler that
    cannot keep prepared statements (PgBouncer before 1.21), a client's statement may land on a
    server session where another client prepared a different statement under the same name: an
    error when their parameters differ in number, and otherwise the other statement executed
    with this one's parameters. Starting each connection's count at a random 48-bit number
    leaves only the error "does not exist", which execute() turns into sending unprepared.
    """
    manager = getattr(raw, "_prepared", None)
    if not isinstance(getattr(manager, "_prepared_idx", None), int):
        return False
    if manager._prepared_idx == 0:  # nothing prepared on it yet
        manager._prepared_idx = secrets.randbits(48)
    _binary_formats(raw)
    _named.add(raw)
    return True


class Binary(list):
    """A hot statement's array parameter (ids, tokens, results of a batch), sent in PostgreSQL's
    binary format where the statement is prepared (_binary_formats): its items of one type, each
    of a type psycopg dumps in binary (int, str, uuid, an aware datetime) or None.

    psycopg sends a list in text by default, item by item in Python, quoting and escaping each (a
    JSON result: 5 µs an item; in binary 0.2 µs); arrays.ArrayDumper packs it in one pass.
    Elsewhere (a statement sent unprepared, through Django's cursor) it is a list like any other,
    sent as text.
    """

    __slots__ = ()


def _binary_formats(raw) -> None:
    """Let the hot statements read their rows in PostgreSQL's binary format, as Django reads text,
    and send their Binary arrays in it.

    A uuid, an integer or a timestamp in binary is loaded without parsing its text. psycopg's
    binary loaders give the values Django's text ones give (a timestamp in the session's timezone,
    which Django sets to its own), but for jsonb, which Django reads as text for its JSONField: so
    here, on this connection alone (Django's own queries read text), does a binary jsonb. Binary
    is a type only these statements pass: Django's queries on the connection dump as before.
    """
    import psycopg
    from psycopg.adapt import Loader

    from django_durable.workpool.arrays import ArrayDumper

    class JsonbText(Loader):
        format = psycopg.pq.Format.BINARY

        def load(self, data):
            return bytes(data[1:]).decode()  # after its format's version byte

    raw.adapters.register_loader("jsonb", JsonbText)
    raw.adapters.register_dumper(Binary, ArrayDumper)


def _idle(raw) -> bool:
    """Whether `raw` is between transactions (a SET now is not undone by a rollback)."""
    import psycopg

    return raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


_numbered_cache: dict[str, str] = {}


def _numbered(sql: str) -> str | None:
    """`sql` with its `%s` placeholders numbered `$1`, `$2`, …, or None if it holds any other `%`."""
    numbered = _numbered_cache.get(sql)
    if numbered is None:
        if "%" in sql.replace("%s", ""):
            return None
        parts = sql.split("%s")
        numbered = "".join(f"{part}${index}" for index, part in enumerate(parts[:-1], 1)) + parts[-1]
        if len(_numbered_cache) > 256:
            _numbered_cache.clear()
        _numbered_cache[sql] = numbered
    return numbered


def execute(db: str, sql: str, params):
    """Run `sql` (a statement that answers rows); return its first row and the row count."""
    global _prepare
    try:
        cursor, text, owned = _cursor(db, sql)
        try:
            # As Django's cursor wrapper sends (refused in a broken transaction, psycopg's errors
            # made Django's), for the psycopg cursor _cursor() may give.
            connection = connections[db]
            connection.validate_no_broken_transaction()
            with connection.wrap_database_errors:
                cursor.execute(text, params)
                # Every statement here ends in a SELECT; asking for `description` first would
                # build a column object for each of its (up to 22) columns.
                return cursor.fetchone(), cursor.rowcount
        finally:
            if owned:
                cursor.close()
    except DatabaseError as exc:
        import psycopg

        refused = (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement)
        if not (_prepare and isinstance(exc.__cause__, refused)):
            raise
        _prepare = False
        logger.warning("The database lost a prepared statement (a pooler in transaction mode?); "
                       "sending statements unprepared from now on.")
        if connections[db].in_atomic_block:
            raise  # the transaction is aborted; the caller's retry will go unprepared
        return execute(db, sql, params)


def in_transaction(db: str, prelude: list[tuple[str, list]], sql: str, params, *, all_rows: bool = False):
    """`sql` after the `prelude` statements ((sql, parameters) pairs) in a transaction of their
    own; return its first row and row count (all its rows with `all_rows`).

    In autocommit (a worker), BEGIN, the prelude, the statement and COMMIT go in one pipeline: one
    round trip, as a statement alone; inside a caller's transaction, they join it.
    """
    connection = connections[db]
    if connection.in_atomic_block or not (_prepare and conf.get("PREPARED_STATEMENTS")) or connection.queries_logged:
        with transaction.atomic(using=db):
            with connection.cursor() as cursor:
                for text, values in prelude:
                    cursor.execute(text, values)
                if all_rows:
                    cursor.execute(sql, params)
                    return cursor.fetchall()
            return execute(db, sql, params)
    cursor, text, owned = _cursor(db, sql)
    raw = connection.connection
    try:
        with connection.wrap_database_errors:
            with raw.pipeline():
                raw.execute("BEGIN")
                for before, values in prelude:
                    raw.execute(before, values)
                cursor.execute(text, params)
                raw.execute("COMMIT")
            return cursor.fetchall() if all_rows else (cursor.fetchone(), cursor.rowcount)
    except BaseException:
        _roll_back(raw)
        raise
    finally:
        if owned:
            cursor.close()


def _roll_back(raw) -> None:
    """End the transaction a failed pipeline left open (an error skips its COMMIT)."""
    import psycopg

    try:
        if not raw.closed and raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raw.execute("ROLLBACK")
    except psycopg.Error:
        pass  # a broken connection: Django closes and replaces it
