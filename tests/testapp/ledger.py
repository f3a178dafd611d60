"""The side-effect ledger: one line per step execution, in a file no rollback or crash can undo.

A file rather than a table: an atomic step holds SQLite's only write lock, so a table written on
a second connection would wait on its own step. Each record is one O_APPEND write, complete
before the step returns, so a worker killed right after it still leaves the line.
"""

import os
from collections import Counter


def _path() -> str:
    path = os.environ.get("DURABLE_TEST_LEDGER")
    if not path:
        raise RuntimeError("DURABLE_TEST_LEDGER is not set (the test fixtures set it).")
    return path


def record(run_id, step) -> None:
    line = f"{run_id} {step} {os.getpid()}\n".encode()
    fd = os.open(_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def entries() -> list[tuple[str, str, int]]:
    try:
        with open(_path()) as f:
            return [(r, s, int(p)) for r, s, p in (line.split() for line in f if line.strip())]
    except FileNotFoundError:
        return []


def counts(run_id) -> dict[str, int]:
    return dict(Counter(step for run, step, _ in entries() if run == str(run_id)))


def count(run_id, step) -> int:
    return counts(run_id).get(step, 0)
