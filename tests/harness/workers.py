"""Worker processes for the tests: real ``manage.py durable_worker`` processes, and waiting for them."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout
ON_POSTGRES = bool(os.environ.get("DURABLE_TEST_DATABASE_URL"))


def wait_for(predicate, timeout=30.0, interval=0.05, message="condition"):
    """Poll `predicate` until it returns something truthy; return it, or fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"Timed out after {timeout}s waiting for {message}.")
        time.sleep(interval)


class WorkerProcess:
    """A real `manage.py durable_worker` process, in its own process group."""

    def __init__(self, popen: subprocess.Popen, log_path: Path):
        self.popen = popen
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, signum: int) -> None:
        os.kill(self.popen.pid, signum)

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crash or an OOM kill would."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(timeout=10)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            self.kill()
            pytest.fail(f"Worker {self.pid} did not exit within {timeout}s. Log:\n{self.log()}")

    def dump_stacks(self) -> None:
        """Every thread of every process of the group prints where it is (faulthandler, on
        SIGABRT), so a hang seen once in CI says where it hung."""
        try:
            os.killpg(self.popen.pid, signal.SIGABRT)
            self.popen.wait(timeout=3)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass

    def freeze(self, attempts: int = 50) -> None:
        """SIGSTOP the process at a moment it holds no transaction open.

        A process frozen inside a write would keep its locks for the whole pause: on SQLite the
        database's one write lock, so no other worker could write at all; on PostgreSQL the rows
        it had locked, which a taker's claim skips. Such a freeze tests the database, not the
        worker, so it is undone (SIGCONT) and tried again a moment later.
        """
        for _ in range(attempts):
            self.signal(signal.SIGSTOP)
            # kill() returns once the signal is sent, not once every thread has stopped: a thread
            # running on another core may still begin a transaction after a probe found none.
            wait_for(self.stopped, timeout=10, interval=0.005, message=f"worker {self.pid} to stop")
            if not writer_elsewhere():
                return
            self.signal(signal.SIGCONT)
            time.sleep(0.05)
        pytest.fail(f"Worker {self.pid} held a transaction open at each of {attempts} tries to freeze it.")

    def stopped(self) -> bool:
        """Whether every thread of the process is stopped (state T in /proc)."""
        states = []
        for task in Path(f"/proc/{self.pid}/task").glob("*"):
            try:
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue  # a thread that ended meanwhile
        return bool(states) and all(state in "TtZX" for state in states)

    def running(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def writer_elsewhere() -> bool:
    """Whether a connection other than this process's holds a transaction open on the test
    database (a write lock on SQLite)."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                " AND xact_start IS NOT NULL"
            )
            return cursor.fetchone()[0] > 0
    import sqlite3

    probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        probe.close()


def in_threads(target, count: int, timeout: float = 240) -> list[Exception]:
    """Run target(i) for i in range(count) in threads at once, each with its own database
    connections (closed after); return what they raised."""
    import threading

    from django.db import connections

    errors = []

    def run(index):
        try:
            target(index)
        except Exception as exc:  # noqa: BLE001 - collected and asserted by the caller
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    return errors

