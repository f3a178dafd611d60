"""`durable_worker --reload`: restart the worker when the project's Python files change.

For development only. A worker imports your workflows once, when it starts, so it keeps running
the code it started with; in production you restart workers when you deploy. This runs the
worker as a child process and, when a `.py` file under the project changes, stops it the way a
deploy would (SIGTERM: the step in flight finishes, its run is handed back) and starts a fresh one.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

logger = logging.getLogger("django_durable.worker")

SKIPPED = {".git", ".hg", ".venv", "venv", "env", "node_modules", "__pycache__", "site-packages", ".tox", ".nox"}


def project_root() -> Path:
    from django.conf import settings

    base = getattr(settings, "BASE_DIR", None)
    return Path(base) if base else Path.cwd()


def snapshot(root: Path) -> dict[str, int]:
    """{path: modification time} of every .py file under `root`, leaving out environments and caches."""
    seen = {}
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d not in SKIPPED and not d.startswith(".")]
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                try:
                    seen[path] = os.stat(path).st_mtime_ns
                except OSError:
                    pass  # removed while we looked: the next look sees it gone
    return seen


def changed(before: dict[str, int], after: dict[str, int]) -> list[str]:
    return sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))


class Reloader:
    """Runs `command` (the worker without --reload) and restarts it when a watched file changes.

    The signal handler only records the signal and wakes the loop through a pipe: a handler runs
    between two bytecodes of whatever the main thread is doing, so it must not take a lock the
    main thread may hold (a `threading.Event` would), nor signal the child itself.
    """

    def __init__(self, command: list[str], root: Path, *, interval: float = 1.0, grace: float = 30.0):
        self.command, self.root, self.interval, self.grace = command, root, interval, grace
        self.child: subprocess.Popen | None = None
        self.signals: list[int] = []  # received, not yet passed on to the child
        self.stop_requested = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        os.set_blocking(self._wake_r, False)

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        logger.warning("Reloading on changes to the Python files under %s (development only).", self.root)
        files = snapshot(self.root)
        self.child = subprocess.Popen(self.command)
        reported_exit = False
        while not self._stopping():
            select.select([self._wake_r], [], [], self.interval)
            self._drain()
            if self._stopping():
                break
            now = snapshot(self.root)
            edits = changed(files, now)
            files = now
            if edits:
                logger.warning("%s changed; restarting the worker.", os.path.relpath(edits[0], self.root)
                               + (f" and {len(edits) - 1} more" if len(edits) > 1 else ""))
                self._stop_child()
                if self._stopping():
                    break
                self.child, reported_exit = subprocess.Popen(self.command), False
            elif self.child.poll() is not None and not reported_exit:
                reported_exit = True
                logger.error("The worker exited with %d; it starts again when a file changes.", self.child.returncode)
        return self._stop_child()

    def _on_signal(self, signum, frame) -> None:
        self.signals.append(signum)
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # the pipe is full: the loop is awake already

    def _drain(self) -> None:
        try:
            os.read(self._wake_r, 64)
        except BlockingIOError:
            pass

    def _stopping(self) -> bool:
        """Pass the signals received on to the child, once each (a second Ctrl-C makes it exit at once)."""
        while self.signals:
            signum = self.signals.pop(0)
            self.stop_requested = True
            if self.child is not None and self.child.poll() is None and not _reached_child(signum):
                self.child.send_signal(signum)
        return self.stop_requested

    def _stop_child(self) -> int:
        child = self.child
        if child is None:
            return 0
        if not self._stopping():  # a restart: the child has not been asked to stop yet
            child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.grace + 10
        while child.poll() is None:
            if time.monotonic() >= deadline:
                logger.error("The worker did not stop within %.0f s; killing it.", self.grace + 10)
                child.kill()
                child.wait()
                break
            select.select([self._wake_r], [], [], 0.1)
            self._drain()
            self._stopping()
        return 0 if child.returncode in (0, -signal.SIGTERM) else child.returncode


def _reached_child(signum: int) -> bool:
    """A Ctrl-C in the terminal reaches every process of the foreground group, the child too:
    passing it on would make it a second one (exit at once) for the child."""
    try:
        return signum == signal.SIGINT and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False  # no terminal: the signal came from kill, to this process only


def worker_command() -> list[str]:
    """This process's command line without --reload: the worker the reloader runs."""
    return [sys.executable, *(arg for arg in sys.orig_argv[1:] if arg != "--reload")]
