"""`durable_worker --reload`: restart the worker when the project's Python files change.

For development only. A worker imports your workflows once, when it starts, so it keeps running
the code it started with; in production you restart workers when you deploy. This runs the
worker as a child process and, when a `.py` file under the project changes, stops it the way a
deploy would (SIGTERM: the step in flight finishes, its run is handed back) and starts a fresh one.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
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
    """Runs `command` (the worker without --reload) and restarts it when a watched file changes."""

    def __init__(self, command: list[str], root: Path, *, interval: float = 1.0, grace: float = 30.0):
        self.command, self.root, self.interval, self.grace = command, root, interval, grace
        self.stopping = threading.Event()
        self.child: subprocess.Popen | None = None

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        logger.warning("Reloading on changes to the Python files under %s (development only).", self.root)
        files = snapshot(self.root)
        self.child = subprocess.Popen(self.command)
        reported_exit = False
        while not self.stopping.wait(self.interval):
            now = snapshot(self.root)
            edits = changed(files, now)
            files = now
            if edits:
                logger.warning("%s changed; restarting the worker.", os.path.relpath(edits[0], self.root)
                               + (f" and {len(edits) - 1} more" if len(edits) > 1 else ""))
                self._stop_child()
                if self.stopping.is_set():
                    break
                self.child, reported_exit = subprocess.Popen(self.command), False
            elif self.child.poll() is not None and not reported_exit:
                reported_exit = True
                logger.error("The worker exited with %d; it starts again when a file changes.", self.child.returncode)
        return self._stop_child()

    def _on_signal(self, signum, frame) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)  # a second Ctrl-C reaches the worker too: it exits at once
        self.stopping.set()

    def _stop_child(self) -> int:
        child = self.child
        if child is None:
            return 0
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(self.grace + 10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return 0 if child.returncode in (0, -signal.SIGTERM) else child.returncode


def worker_command() -> list[str]:
    """This process's command line without --reload: the worker the reloader runs."""
    return [sys.executable, *(arg for arg in sys.orig_argv[1:] if arg != "--reload")]
