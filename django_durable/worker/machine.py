"""Which machine and process namespace this process runs in, and whether a process of it is gone.

A host name does not prove two processes share a machine (containers share names), nor that a pid
names the same process (each container counts its own). The kernel's boot id and the pid
namespace do: two processes that agree on both see the same processes under the same pids, so
one can tell for certain that the other's process no longer exists.
"""

from __future__ import annotations

import os
from functools import cache


@cache
def identity() -> str:
    """This process's boot id and pid namespace ("<boot id>/pid:[<inode>]"), or "" where either
    cannot be read (not Linux, a restricted /proc): then no process is ever judged gone by it."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            boot = file.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}"[:100] if boot and namespace else ""


def gone(pid: int) -> bool:
    """Whether no process `pid` exists in this pid namespace now (a process this one replaced,
    under this very pid, is gone too)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists, owned by someone else
    return False
