"""The set-up scripts on a fresh machine: an install waits for the package manager's lock, which
another apt (unattended upgrades at boot) often holds, instead of failing at once (T50)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import threading
import time

import pytest

from tests.conftest import ROOT

LOCK = "/var/lib/dpkg/lock-frontend"

pytestmark = [pytest.mark.processes, pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("apt-get") or not os.path.exists(LOCK),
    reason="needs root and Debian's apt")]


@pytest.mark.timeout(300)
def test_an_install_waits_for_the_package_managers_lock():
    held = threading.Event()
    released = {}

    def another_apt():
        with open(LOCK, "w") as lock:
            fcntl.lockf(lock, fcntl.LOCK_EX)  # as apt and dpkg take it (fcntl)
            held.set()
            time.sleep(3)
            released["at"] = time.monotonic()
            fcntl.lockf(lock, fcntl.LOCK_UN)

    holder = threading.Thread(target=another_apt)
    holder.start()
    assert held.wait(30)
    # A package every Debian machine has: nothing is downloaded, only the lock is taken.
    done = subprocess.run([str(ROOT / "scripts" / "apt-install.sh"), "bash"], capture_output=True, text=True,
                          timeout=240, env={**os.environ, "DURABLE_APT_LOCK_SECONDS": "120"})
    finished = time.monotonic()
    holder.join(timeout=30)
    assert done.returncode == 0, done.stderr
    assert finished >= released["at"], "the install went ahead while another apt held the lock"

