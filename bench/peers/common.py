"""What every peer's driver shares (standard library only: each runs in its peer's own venv).

A driver does one workload of one system (`--workload w5`, the default, `w2`, or for the systems
that have workflows `w1` and `w3`) and prints one JSON object on its last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import statistics
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
    seconds meanwhile, the wall time, the largest peak RSS of a worker (MB), and the machine's
    busy CPU sampled every 20 ms meanwhile (`cpu_during()` reads it over a window)."""
    import threading

    samples, stop = [], threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.time(), busy_seconds()))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    before_cpu, before = busy_seconds(), time.perf_counter()
    processes = [subprocess.Popen(command, env={**os.environ, **(env or {})}) for command in commands]
    try:
        for process in processes:
            if process.wait(timeout) != 0:
                raise SystemExit(f"a worker exited with {process.returncode}: {process.args}")
    finally:
        stop.set()
        sampler.join()
    return {"busy_cpu_s": busy_seconds() - before_cpu, "wall_s": time.perf_counter() - before,
            "worker_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "samples": samples}


def cpu_during(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """The machine's busy CPU seconds between the epoch times `start` and `end`, from the samples
    run_workers() took (interpolated between the two samples around each end)."""
    def at(moment):
        for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
            if t0 <= moment <= t1:
                return c0 + (c1 - c0) * (moment - t0) / ((t1 - t0) or 1)
        raise SystemExit(f"no CPU sample around {moment}: the drain's times are off the sampled span")

    return at(end) - at(start)


@contextlib.contextmanager
def serving(commands: list[list[str]], env: dict | None = None):
    """Long-running worker processes (W2, W3), stopped with SIGTERM (killed after 30 s) at the end."""
    processes = [subprocess.Popen(command, env={**os.environ, **(env or {})}) for command in commands]
    try:
        yield processes
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)


def wait_until(check, timeout: float, every: float = 0.001) -> None:
    """Poll `check()` every `every` seconds until it is true; fail the driver after `timeout`."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"not done within {timeout} s")
        time.sleep(every)


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def latency_w2(system: str, version: str, count: int, enqueue, finished, server_seconds) -> None:
    """W2: one job at a time on an idle worker. `enqueue(n)` returns a handle, `finished(handle)`
    says whether it has ended (polled every millisecond), `server_seconds()` lists, oldest first,
    each job's time from enqueued to finished by the database's clock. The first job only warms
    up (the worker is started and listening once it is done) and is left out of the figures."""
    first = enqueue(-1)
    wait_until(lambda: finished(first), timeout=120, every=0.01)
    client = []
    for n in range(count):
        started = time.perf_counter()
        handle = enqueue(n)
        wait_until(lambda: finished(handle), timeout=60)
        client.append(time.perf_counter() - started)
    server = [float(s) for s in server_seconds()][1:]
    if len(server) != count:
        raise SystemExit(f"{system}: {len(server)} of {count} jobs have finishing times")
    report({"system": system, "version": version, "jobs": count,
            "p50_ms": 1000 * statistics.median(server), "p95_ms": 1000 * percentile(server, 0.95),
            "client_p50_ms": 1000 * statistics.median(client), "client_p95_ms": 1000 * percentile(client, 0.95)})


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


def report_w5(system: str, version: str, jobs: int, done: int, window, enqueue_per_s: float, drained: dict) -> None:
    """Check every job finished; print the W5 figures: drained per second over `window` (the first
    job's start to the last one's end, epoch seconds by the database's clock, the same machine's),
    the machine's busy CPU per job over that window ("cpu_ms_per_job": workers and PostgreSQL at
    work, without the processes' start-up and exit) and over the workers' whole lives
    ("lifetime_cpu_ms_per_job"), and the rest of run_workers()'s figures."""
    if done != jobs:
        raise SystemExit(f"{system}: {done} of {jobs} jobs finished")
    start, end = (float(moment) for moment in window)
    samples = drained.pop("samples")
    report({"system": system, "version": version, "jobs": jobs, "enqueue_per_s": enqueue_per_s,
            "drain_per_s": jobs / (end - start), "cpu_ms_per_job": 1000 * cpu_during(samples, start, end) / jobs,
            "lifetime_cpu_ms_per_job": 1000 * drained["busy_cpu_s"] / jobs, **drained})


def argument(name: str, default=None):
    """--name VALUE from the command line."""
    if f"--{name}" in sys.argv:
        return sys.argv[sys.argv.index(f"--{name}") + 1]
    return default
