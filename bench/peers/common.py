"""What every peer's driver shares (standard library only: each runs in its peer's own venv).

A driver does one workload of one system (`--workload w5`, the default, `w2`, or for the systems
that have workflows `w1` and `w3`) and prints one JSON object on its last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import NamedTuple


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot: user, system and interrupts (not
    idle, waiting for I/O, or stolen by the hypervisor for other machines)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int, reaped: bool) -> float:
    """CPU seconds of process `pid` so far, with (`reaped`) those of the children it has waited for."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """`pid` and its live descendants."""
    found, pending = [], [pid]
    while pending:
        current = pending.pop()
        found.append(current)
        try:
            with open(f"/proc/{current}/task/{current}/children") as children:
                pending.extend(int(child) for child in children.read().split())
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found


def peak_rss_mb(roots: list[int]) -> float:
    """The largest peak resident set (VmHWM) of the processes of the trees at `roots`, in MB.

    Read from each process itself: getrusage(RUSAGE_CHILDREN) would also count the driver's own
    pages, which a child started by fork and exec carries for the moment before its exec (a
    driver that enqueued its jobs through Django is bigger than the workers it starts)."""
    peak = 0
    for root in roots:
        for pid in _tree(root):
            try:
                with open(f"/proc/{pid}/status") as status:
                    for line in status:
                        if line.startswith("VmHWM:"):
                            peak = max(peak, int(line.split()[1]))
                            break
            except (FileNotFoundError, ProcessLookupError):
                pass
    return peak / 1024


def system_cpu(roots: list[int]) -> float:
    """CPU seconds used so far by the processes of the system under test: each root (a worker
    process, or PostgreSQL's postmaster) with what it reaped, and its live descendants.

    The machine is shared: its busy time counts other tenants' work too, this does not. A process
    that exits between two readings moves from its own count to its parent's reaped count, so
    nothing is lost or counted twice once it has been waited for.
    """
    total = 0.0
    for root in roots:
        tree = _tree(root)
        total += _process_cpu(root, reaped=True) + sum(_process_cpu(pid, reaped=True) for pid in tree[1:])
    return total


def postmaster(url: str) -> int:
    """The pid of the PostgreSQL server's postmaster (the parent of a backend), on this machine."""
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://", 1)) as connection:
        (backend,) = connection.execute("SELECT pg_backend_pid()").fetchone()
        with open(f"/proc/{backend}/stat") as stat:  # while the backend lives: it exits with the connection
            return int(stat.read().rsplit(")", 1)[1].split()[1])


def run_workers(commands: list[list[str]], env: dict | None = None, timeout: float = 900, url: str = "") -> dict:
    """Start the worker processes, wait for all of them to exit; return the machine's busy CPU
    seconds meanwhile, the wall time, the largest peak RSS of a worker (MB), when they were
    spawned (epoch seconds, "spawned_at"), and, sampled every 20 ms meanwhile, the machine's busy
    CPU, the workers' CPU and the PostgreSQL server's at `url` (`cpu_during()` reads any of them
    over a window)."""
    import threading

    server = postmaster(url or os.environ["DATABASE_URL"])
    machine, workers, database, stop = [], [], [], threading.Event()
    processes, rss = [], [0.0]

    def sample():
        while not stop.is_set():
            now = time.time()
            machine.append((now, busy_seconds()))
            workers.append((now, system_cpu([p.pid for p in processes])))
            database.append((now, system_cpu([server])))
            rss[0] = max(rss[0], peak_rss_mb([p.pid for p in processes]))
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    before_cpu, before, spawned = busy_seconds(), time.perf_counter(), time.time()
    processes.extend(subprocess.Popen(command, env={**os.environ, **(env or {})}) for command in commands)
    sampler.start()
    try:
        for process in processes:
            if process.wait(timeout) != 0:
                raise SystemExit(f"a worker exited with {process.returncode}: {process.args}")
    finally:
        stop.set()
        sampler.join()
    return {"busy_cpu_s": busy_seconds() - before_cpu, "wall_s": time.perf_counter() - before,
            "worker_peak_rss_mb": rss[0], "spawned_at": spawned,
            "samples": machine, "worker_samples": workers, "database_samples": database}


def cpu_during(samples: list[tuple[float, float]], start: float, end: float) -> float:
    """CPU seconds between the epoch times `start` and `end`, from the (time, CPU so far) samples
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
    start with statistics that know the enqueued jobs (fresh tables otherwise plan as empty).
    With --no-analyze, nothing: the drain meets the tables as a fresh install does, with no
    statistics until autovacuum's first ANALYZE (which may come during the drain)."""
    if "--no-analyze" in sys.argv:
        return
    import psycopg

    with psycopg.connect(url.replace("postgres://", "postgresql://", 1), autocommit=True) as connection:
        connection.execute("ANALYZE")


class Enqueued(NamedTuple):
    """W5's enqueue: jobs per second, and the enqueuing process's CPU a job (µs: the client's side)."""

    per_s: float
    cpu_us: float

    @staticmethod
    def clocks() -> tuple[float, float]:
        """The wall clock and the process's CPU clock now, for since()."""
        return time.perf_counter(), time.process_time()

    @classmethod
    def since(cls, clocks: tuple[float, float], count: int) -> Enqueued:
        """`count` jobs enqueued since clocks() gave `clocks`."""
        wall, cpu = clocks
        return cls(count / (time.perf_counter() - wall), 1e6 * (time.process_time() - cpu) / count)


def timed_enqueue(enqueue, count: int) -> Enqueued:
    """Enqueue `count` jobs one at a time (each its own commit); how many per second, and the CPU."""
    began = Enqueued.clocks()
    for n in range(count):
        enqueue(n)
    return Enqueued.since(began, count)


def report(figures: dict) -> None:
    print(json.dumps(figures), flush=True)


def report_w5(system: str, version: str, jobs: int, done: int, window, enqueued: Enqueued, drained: dict) -> None:
    """Check every job finished; print the W5 figures: drained per second over `window` (the first
    job's start to the last one's end, epoch seconds by the database's clock, the same machine's);
    over that window, the CPU per job of the workers and PostgreSQL ("cpu_ms_per_job", and each
    apart: without the processes' start-up and exit, or other tenants' work) and the machine's
    busy CPU per job ("machine_cpu_ms_per_job"); the workers' start, from their spawn to the first
    job's start ("first_job_s": the same machine's clock on both sides); and the rest of
    run_workers()'s figures."""
    if done != jobs:
        raise SystemExit(f"{system}: {done} of {jobs} jobs finished")
    start, end = (float(moment) for moment in window)
    machine, workers, database = drained.pop("samples"), drained.pop("worker_samples"), drained.pop("database_samples")
    first_job_s = start - drained.pop("spawned_at")
    per_job = {name: 1000 * cpu_during(samples, start, end) / jobs
               for name, samples in (("workers", workers), ("database", database), ("machine", machine))}
    report({"system": system, "version": version, "jobs": jobs, "enqueue_per_s": enqueued.per_s,
            "enqueue_cpu_us": enqueued.cpu_us,
            "drain_per_s": jobs / (end - start), "cpu_ms_per_job": per_job["workers"] + per_job["database"],
            "workers_cpu_ms_per_job": per_job["workers"], "database_cpu_ms_per_job": per_job["database"],
            "machine_cpu_ms_per_job": per_job["machine"], "first_job_s": first_job_s, **drained})


def report_w1(system: str, version: str, workflows: int, done: int, window, drained: dict, steps: int = 10) -> None:
    """Check every workflow finished; print W1's figures: steps per second over `window` (the
    first workflow's start to the last one's end, epoch seconds by the database's clock) and, over
    that window, the CPU per step of the workers and PostgreSQL (each apart, as report_w5)."""
    if done != workflows:
        raise SystemExit(f"{system}: {done} of {workflows} workflows finished")
    start, end = (float(moment) for moment in window)
    count = steps * workflows
    per_step = {name: 1000 * cpu_during(drained[key], start, end) / count
                for name, key in (("workers", "worker_samples"), ("database", "database_samples"))}
    report({"system": system, "version": version, "workflows": workflows, "steps_per_s": count / (end - start),
            "seconds": end - start, "cpu_ms_per_step": per_step["workers"] + per_step["database"],
            "workers_cpu_ms_per_step": per_step["workers"], "database_cpu_ms_per_step": per_step["database"]})


def argument(name: str, default=None):
    """--name VALUE from the command line."""
    if f"--{name}" in sys.argv:
        return sys.argv[sys.argv.index(f"--{name}") + 1]
    return default


# -- a steady load while a snapshot is held (make bench-horizon) ------------------------------------

WINDOW = 10.0  # seconds a sample covers


# The most jobs one commit of the steady load's producer enqueues.
MOST_A_COMMIT = 50


def steady(system: str, version: str, url: str, enqueue_many, rate: float, seconds: float, hold_at: float,
           hold_for: float, tables: list[str], jobs, settle: float = 120.0) -> None:
    """Enqueue at `rate` jobs a second for `seconds` while the system's workers run: paced by the
    clock, the jobs due by now in one commit (`enqueue_many(numbers)`, at most MOST_A_COMMIT), so
    that one producer offers what the workers drain (a commit per job tops out far below it), with one REPEATABLE READ snapshot held open from `hold_at` to
    `hold_at + hold_for` seconds; every WINDOW seconds, the dead and live row versions, and the
    table and index sizes, of `tables`. Then wait (at most `settle` s) for the backlog to drain and
    print, per window: jobs finished, enqueue-to-claim latency p50/p99 of the jobs claimed in it,
    the backlog at its end, and the tables' figures. `jobs()` lists each job's (enqueued, claimed,
    finished) epoch seconds by the database's clock; claimed and finished None while not yet."""
    import threading

    import psycopg

    url = url.replace("postgres://", "postgresql://", 1)
    stop, samples = threading.Event(), []
    begin = time.time()

    def sample() -> None:
        with psycopg.connect(url, autocommit=True) as connection:
            while True:
                rows = connection.execute(
                    "SELECT relname, n_dead_tup, n_live_tup, pg_table_size(relid), pg_indexes_size(relid), "
                    "autovacuum_count, last_autovacuum FROM pg_stat_user_tables WHERE relname = ANY(%s)",
                    [tables]).fetchall()
                samples.append((time.time() - begin, {row[0]: {
                    "dead": row[1], "live": row[2], "table_kb": row[3] // 1024, "index_kb": row[4] // 1024,
                    "autovacuums": row[5]} for row in rows}))
                if stop.wait(WINDOW):
                    return

    def hold() -> None:
        if stop.wait(hold_at):
            return
        with psycopg.connect(url, application_name="bench-horizon-holder") as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute(f"SELECT count(*) FROM {tables[0]}")  # the snapshot, held until the commit
            stop.wait(hold_for)
            holder.execute("COMMIT")

    threads = [threading.Thread(target=sample, daemon=True), threading.Thread(target=hold, daemon=True)]
    for thread in threads:
        thread.start()
    n, total = 0, int(rate * seconds)
    while n < total:  # the n-th job's time is begin + n / rate: no drift
        due = min(total, int((time.time() - begin) * rate) + 1, n + MOST_A_COMMIT)
        if due > n:
            enqueue_many(range(n, due))
            n = due
        else:
            time.sleep(max(0.0, begin + n / rate - time.time()))
    deadline = time.time() + settle
    while time.time() < deadline and any(finished is None for _, _, finished in jobs()):
        time.sleep(1)
    stop.set()
    for thread in threads:
        thread.join()
    report({"system": system, "version": version, "rate": rate, "seconds": seconds, "enqueued": n,
            "hold": [hold_at, hold_at + hold_for], "windows": windows(jobs(), begin, seconds + settle, samples)})


def windows(jobs: list, begin: float, span: float, samples: list) -> list[dict]:
    """The per-window figures of steady(): `jobs` as (enqueued, claimed, finished) epoch seconds."""
    found = []
    for index in range(int(span // WINDOW) + 1):
        start, end = begin + index * WINDOW, begin + (index + 1) * WINDOW
        claimed = [float(c) - float(e) for e, c, _ in jobs if c is not None and start <= float(c) < end]
        finished = sum(1 for _, _, f in jobs if f is not None and start <= float(f) < end)
        backlog = sum(1 for e, _, f in jobs if float(e) < end and (f is None or float(f) >= end))
        if not claimed and not finished and not backlog and index * WINDOW > 0:
            break
        tables = next((figures for at, figures in samples if at >= index * WINDOW), {})
        found.append({"t": index * WINDOW, "finished": finished, "backlog": backlog,
                      "claim_p50_ms": 1000 * statistics.median(claimed) if claimed else None,
                      "claim_p99_ms": 1000 * percentile(claimed, 0.99) if claimed else None, "tables": tables})
    return found
