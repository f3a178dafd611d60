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

    def running(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


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

