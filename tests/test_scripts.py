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

pytestmark = [pytest.mark.processes, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not shutil.which("apt-get") or not os.path.exists(LOCK), reason="needs Debian's apt")
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


def _cpu_cgroup() -> str | None:
    """Where the cgroup cpu controller is: its v1 mount, or a v2 root that offers cpu; else None."""
    with open("/proc/mounts") as mounts:
        rows = [line.split() for line in mounts]
    for _, where, kind, options, *_ in rows:
        if kind == "cgroup" and "cpu" in options.split(","):
            return where
    for _, where, kind, *_ in rows:
        if kind == "cgroup2":
            with open(os.path.join(where, "cgroup.controllers")) as controllers:
                if "cpu" in controllers.read().split():
                    return where
    return None


@pytest.mark.timeout(60)
@pytest.mark.skipif(_cpu_cgroup() is None, reason="needs a cgroup cpu controller")
def test_slow_cores_runs_a_command_under_a_cpu_quota_and_removes_its_group():
    script, base = str(ROOT / "scripts" / "slow-cores.sh"), _cpu_cgroup()
    # The command sees itself in the group, and the group's quota (v1's, or v2's "quota period"):
    # the cores over FACTOR.
    shown = subprocess.run(
        [script, "4", "sh", "-c", "cat /proc/self/cgroup; for f in \"$0\"/durable-slow-*/cpu.cfs_quota_us "
         "\"$0\"/durable-slow-*/cpu.max; do [ -f \"$f\" ] && cat \"$f\"; done; exit 3", base],
        capture_output=True, text=True, timeout=30)
    assert shown.returncode == 3, shown.stderr  # the command's own exit status
    assert "durable-slow-" in shown.stdout
    quota = len(os.sched_getaffinity(0)) * 10000 // 4  # as nproc counts the cores
    assert str(quota) in shown.stdout.split(), shown.stdout
    assert not [name for name in os.listdir(base) if name.startswith("durable-slow-")]  # removed after
    refused = subprocess.run([script, "0.5", "true"], capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "FACTOR" in refused.stderr
