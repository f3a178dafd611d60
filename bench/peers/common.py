"""What every peer's driver shares (standard library only: each runs in its peer's own venv).

A driver does one workload of one system and prints one JSON object on its last line.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def run_workers(commands: list[list[str]], env: dict | None = None, timeout: float = 900) -> dict:
    """Start the worker processes, wait for all of them to exit; return the machine's busy CPU
    seconds meanwhile, the wall time and the largest peak RSS of a worker (MB)."""
    before_cpu, before = busy_seconds(), time.perf_counter()
    processes = [subprocess.Popen(command, env={**os.environ, **(env or {})}) for command in commands]
    for process in processes:
        if process.wait(timeout) != 0:
            raise SystemExit(f"a worker exited with {process.returncode}: {process.args}")
    return {"busy_cpu_s": busy_seconds() - before_cpu, "wall_s": time.perf_counter() - before,
            "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def analyze(url: str) -> None:
    """ANALYZE the database, as autovacuum does once a table has grown: every system's workers
    start with statistics that know the enqueued jobs (fresh tables otherwise plan as empty)."""
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as connection:
        connection.execute("ANALYZE")


def timed_enqueue(enqueue, count: int) -> float:
    """Enqueue `count` jobs one at a time (each its own commit); return how many per second."""
    started = time.perf_counter()
    for n in range(count):
        enqueue(n)
    return count / (time.perf_counter() - started)


def report(figures: dict) -> None:
    print(json.dumps(figures), flush=True)


def report_w5(system: str, version: str, jobs: int, done: int, seconds, enqueue_per_s: float, drained: dict) -> None:
    """Check every job finished; print the W5 figures: drained per second over `seconds` (first
    start to last end, by the database's clock), machine CPU per job, and the run_workers() ones."""
    if done != jobs:
        raise SystemExit(f"{system}: {done} of {jobs} jobs finished")
    report({"system": system, "version": version, "jobs": jobs, "enqueue_per_s": enqueue_per_s,
            "drain_per_s": jobs / float(seconds), "cpu_ms_per_job": 1000 * drained["busy_cpu_s"] / jobs, **drained})


def argument(name: str, default=None):
    """--name VALUE from the command line."""
    if f"--{name}" in sys.argv:
        return sys.argv[sys.argv.index(f"--{name}") + 1]
    return default
