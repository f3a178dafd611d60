"""Interleaved rounds against the peers, on one PostgreSQL server (`make bench-peers`).

    DATABASE_URL=postgres://.../any .venv/bin/python bench/peers/rounds.py [--rounds 3] [--workloads w5,w5-fresh,w2,w1,w3]
        [--jobs 5000] [--latency-jobs 200] [--workflows 2000] [--fanout 500] [--processes 2] [--json FILE]
        [--no-analyze] [--systems a,b] [--baseline DIR]

Each round runs every workload on every system that has it, one after the other on the same
server: the raw SKIP LOCKED ceiling (one statement a row in autocommit, and beside it the
four-round-trip loop earlier figures used), django-durable (tasks, and one-step workflows in W5;
and W5's tasks once more in a Django 6 project on the peers' Python, its workers started with the
project's settings and with settings of their own, bench/worker_settings.py), and each peer whose
virtual environment exists under bench/.venvs/ (made by scripts/bench-peers.sh): django-ox, PGQueuer (psycopg's driver, and asyncpg's, and asyncpg's once more on .venv's Python), Procrastinate,
django-tasks-db, DBOS, Oban for Python, django-absurd; each round starts with the next system in that list. Every run gets a fresh database of
its own, after a CHECKPOINT. The workloads:

- W5-fresh: W5 with no ANALYZE before the drain, as a fresh install meets its tables (autovacuum
  may analyze them during the drain, as it would there);
- W5: N one-step jobs enqueued one at a time (each its own commit: the enqueue rate, and the
  enqueuing process's CPU a job, the client's share of an enqueue), then
  drained by P worker processes (jobs per second from the first job's start to the last one's
  end, by the database's clock), with the machine's busy CPU over the drain divided by N
  (workers and PostgreSQL together), the largest worker's peak RSS, and the workers' start: from
  their spawn to the first job's start (a cold start, the worker's whole start-up: with
  --processes 1 one process's, as on slower cores; with more under scripts/slow-cores.sh, whose
  quota the group shares, systems that set Django up in each process pay it once a process);
- W2: one one-step job at a time on an idle worker: enqueued to finished by the database's
  clock, and enqueue to seen finished by a client polling every millisecond;
- W1: ten-step workflows drained by P processes, steps per second (systems with workflows);
- W3: one workflow fanning out to N one-step items and waiting for them all, P processes.

With --baseline DIR (a checkout of an earlier commit: `git worktree add DIR COMMIT`), django-durable
also runs as that commit has it, in the same rounds: "(before)" beside the code as it is.

Ratios to the ceiling and between systems are taken within each round, so a noisy machine moves
both sides together; the medians of the rounds are printed, and with --json written out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENVS = HERE.parent / ".venvs"

SYSTEMS = [  # (name, python, driver, extra arguments, URL style, workloads)
    ("ceiling", ROOT / ".venv/bin/python", "durable_driver.py", ["--ceiling"], "postgres", {"w5"}),
    ("ceiling (four-trips)", ROOT / ".venv/bin/python", "durable_driver.py", ["--ceiling", "--loop", "four-trips"],
     "postgres", {"w5"}),
    ("django-durable", ROOT / ".venv/bin/python", "durable_driver.py", [], "postgres", {"w5", "w2", "w1", "w3"}),
    ("django-durable-workflows", ROOT / ".venv/bin/python", "durable_driver.py", ["--workflows"], "postgres", {"w5"}),
    # The same tasks in a Django 6 project (django.tasks itself, Django's default LOGGING), on the
    # peers' Python; the two rows above run in .venv (the oldest supported Django and Python).
    ("django-durable-django6", VENVS / "durable-django6/bin/python", "durable_driver.py", [], "postgres", {"w5"}),
    # And its workers started with settings of their own, as docs/workers.md advises: the project
    # less the apps that only serve requests (the peers' workers run in projects of two apps).
    ("django-durable-django6 (worker settings)", VENVS / "durable-django6/bin/python", "durable_driver.py",
     ["--worker-settings", "bench.worker_settings"], "postgres", {"w5"}),
    ("django-ox", VENVS / "ox/bin/python", "ox_driver.py", [], "postgresql", {"w5", "w2"}),
    # W2 with psycopg's driver takes 3 s a job (its listener holds the connection a second at a
    # time): measured apart (docs/performance.md), not in every round.
    ("pgqueuer", VENVS / "pgqueuer/bin/python", "pgqueuer_driver.py", [], "postgresql", {"w5"}),
    ("pgqueuer-asyncpg", VENVS / "pgqueuer/bin/python", "pgqueuer_driver.py", ["--driver", "asyncpg"], "postgresql",
     {"w5", "w2"}),
    # The same on .venv's Python, the django-durable rows': the two compared on one interpreter.
    ("pgqueuer-asyncpg-same-python", VENVS / "pgqueuer-same-python/bin/python", "pgqueuer_driver.py",
     ["--driver", "asyncpg"], "postgresql", {"w5"}),
    ("procrastinate", VENVS / "procrastinate/bin/python", "procrastinate_driver.py", [], "postgresql", {"w5", "w2"}),
    ("django-tasks-db", VENVS / "tasks-db/bin/python", "tasksdb_driver.py", [], "postgresql", {"w5", "w2"}),
    ("dbos", VENVS / "dbos/bin/python", "dbos_driver.py", [], "postgresql", {"w5", "w2", "w1", "w3"}),
    ("oban", VENVS / "oban/bin/python", "oban_driver.py", [], "postgresql", {"w5", "w2"}),
    ("django-absurd", VENVS / "absurd/bin/python", "absurd_driver.py", [], "postgresql", {"w5", "w2", "w1"}),
]


def fresh_database(base: str, name: str) -> str:
    import psycopg

    parts = urlsplit(base)
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    with psycopg.connect(admin, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{name}"')
        # Every system starts just after a checkpoint, so none pays for the one the system before
        # it made due (the first change of each page after a checkpoint writes the whole page).
        connection.execute("CHECKPOINT")
    return urlunsplit(parts._replace(path=f"/{name}"))


def baseline(root: Path) -> list[tuple]:
    """django-durable's systems as the checkout at `root` has them (git worktree add DIR COMMIT),
    measured in the same rounds as this one: "before" beside "after"."""
    return [(f"{name} (before)", python, driver, extra, scheme, workloads, root)
            for name, python, driver, extra, scheme, workloads in SYSTEMS
            if name.startswith("django-durable")]


def run_one(system, workload: str, base: str, size: int, processes: int, no_analyze: bool = False) -> dict:
    name, python, driver, extra, scheme, _, *root = system
    url = fresh_database(base, "peers_" + "".join(c if c.isalnum() else "_" for c in name))
    if scheme == "postgresql":
        url = url.replace("postgres://", "postgresql://", 1)
    env = {"DATABASE_URL": url, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    if root:  # another checkout's code, ahead of the installed one
        env["PYTHONPATH"] = str(root[0])
    command = [str(python), str((root[0] / "bench/peers" if root else HERE) / driver), "--url", url, "--workload", workload, "--jobs", str(size),
               "--processes", str(processes), *extra, *(["--no-analyze"] if no_analyze else [])]
    # In a process group of its own, ended whole if this harness stops (a time limit, Ctrl-C, a
    # SIGTERM: see stop_on_sigterm()), so that the driver's worker processes do not outlive it.
    driver_process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True)
    try:
        stdout, stderr = driver_process.communicate(timeout=1800)
    finally:
        if driver_process.poll() is None:
            os.killpg(driver_process.pid, signal.SIGKILL)
            driver_process.wait()
    if driver_process.returncode != 0:
        raise SystemExit(f"{name} {workload} failed:\n{stdout[-2000:]}\n{stderr[-4000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def stop_on_sigterm() -> None:
    """SIGTERM ends this harness as Ctrl-C does, through its `finally` blocks (run_one's ends the
    driver's process group), instead of leaving the driver and its workers running."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def main() -> None:
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="w5,w5-fresh,w2,w1,w3")
    parser.add_argument("--jobs", type=int, default=5000, help="W5's jobs")
    parser.add_argument("--latency-jobs", type=int, default=200, help="W2's jobs")
    parser.add_argument("--workflows", type=int, default=2000, help="W1's ten-step workflows")
    parser.add_argument("--fanout", type=int, default=500, help="W3's items")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--baseline", type=Path, help="also django-durable as the checkout at this path has it")
    parser.add_argument("--systems", default="", help="only these systems (comma-separated names; default all)")
    parser.add_argument("--no-analyze", action="store_true",
                        help="every workload without an ANALYZE first (W5-fresh is W5 without it in any case)")
    args = parser.parse_args()
    sizes = {"w5": args.jobs, "w5-fresh": args.jobs, "w2": args.latency_jobs, "w1": args.workflows,
             "w3": args.fanout}
    workloads = args.workloads.split(",")
    if unknown := set(workloads) - set(sizes):
        parser.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    base = os.environ["DATABASE_URL"]
    chosen = [name for name in args.systems.split(",") if name]
    if unknown := set(chosen) - {s[0] for s in SYSTEMS}:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    systems = [s for s in SYSTEMS if Path(s[1]).exists() and (not chosen or s[0] in chosen)]
    if args.baseline:
        systems[1:1] = [s for s in baseline(args.baseline.resolve())
                        if Path(s[1]).exists() and (not chosen or s[0].removesuffix(" (before)") in chosen)]
    missing = [s[0] for s in SYSTEMS if not Path(s[1]).exists()]
    if missing:
        print(f"left out (no virtual environment; run scripts/bench-peers.sh): {', '.join(missing)}", file=sys.stderr)
    rounds = []
    for number in range(1, args.rounds + 1):
        figures = {workload: {} for workload in workloads}
        # Each round starts with another system, so that none always runs right after the same one.
        shift = (number - 1) % len(systems)
        for workload in workloads:
            for system in systems[shift:] + systems[:shift]:
                if workload.removesuffix("-fresh") in system[5]:
                    result = run_one(system, workload.removesuffix("-fresh"), base, sizes[workload], args.processes,
                                     args.no_analyze or workload.endswith("-fresh"))
                    figures[workload][system[0]] = result
                    shown = ", ".join(f"{k} {v:.1f}" for k, v in result.items() if isinstance(v, float))
                    print(f"round {number}: {workload}: {system[0]}: {shown}", file=sys.stderr, flush=True)
        if "w1" in figures and systems[0][0] == "ceiling":  # W1 is compared with W5's ceiling
            figures["w1"]["ceiling"] = figures.get("w5", {}).get("ceiling") \
                or run_one(systems[0], "w5", base, sizes["w5"], args.processes)
        rounds.append(figures)
    names = [s[0] for s in systems]
    print("\n\n".join(TABLES[w](rounds, names, args) for w in workloads))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "sizes": sizes, "processes": args.processes}, indent=1))


def _median(rounds, workload, name, key):
    values = [r[workload][name][key] for r in rounds if key in r[workload].get(name, {})]
    return statistics.median(values) if values else None


def _ratios(rounds, workload, name, key, other, other_key=None):
    return [r[workload][name][key] / r[workload][other][other_key or key] for r in rounds
            if key in r[workload].get(name, {}) and (other_key or key) in r[workload].get(other, {})]


def _version(rounds, workload, name):
    return rounds[0][workload].get(name, {}).get("version", "")


def w5_table(rounds, names, args, key: str = "w5") -> str:
    # The closest competitor present: PGQueuer on asyncpg, else django-ox, else Procrastinate.
    rival = next((n for n in ("pgqueuer-asyncpg", "django-ox", "procrastinate") if n in names), "")
    title = "W5" if key == "w5" else "W5 as a fresh install meets its tables (no ANALYZE before the drain)"
    lines = [f"{title}: {args.jobs} one-step jobs, {args.processes} worker processes, median of {len(rounds)} rounds",
             "", f"| system | version | jobs drained/s | share of the ceiling (per round) | vs {rival} (per round) "
             "| CPU per job: workers + PostgreSQL (whole machine) | enqueue/s (client CPU a job) | worker peak RSS "
             "| spawn to first job |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in names:
        drained = _median(rounds, key, name, "drain_per_s")
        share = ", ".join(f"{x:.2f}x" for x in _ratios(rounds, key, name, "drain_per_s", "ceiling")) \
            if name != "ceiling" else "—"
        versus = ", ".join(f"{x:.2f}x" for x in _ratios(rounds, key, name, "drain_per_s", rival)) \
            if rival in names and name not in ("ceiling", rival) else "—"
        enqueue, rss = _median(rounds, key, name, "enqueue_per_s"), _median(rounds, key, name, "worker_peak_rss_mb")
        client = _median(rounds, key, name, "enqueue_cpu_us")
        enqueue_text = (f"{enqueue:.0f}" + (f" ({client:.0f} µs)" if client else "")) if enqueue else "—"
        machine = _median(rounds, key, name, "machine_cpu_ms_per_job")
        machine = f"{machine:.2f} ms" if machine else "—"
        start = _median(rounds, key, name, "first_job_s")
        start = f"{start:.2f} s" if start else "—"
        lines.append(f"| {name} | {_version(rounds, key, name)} | {drained:.0f} | {share} | {versus} "
                     f"| {_cpu(rounds, name, key)} ({machine}) "
                     f"| {enqueue_text} | {f'{rss:.0f} MB' if rss else '—'} | {start} |")
    return "\n".join(lines)


def _cpu(rounds, name, key: str = "w5") -> str:
    total = _median(rounds, key, name, "cpu_ms_per_job")
    workers, database = (_median(rounds, key, name, f"{part}_cpu_ms_per_job") for part in ("workers", "database"))
    if workers is None:
        return f"{total:.2f} ms"
    return f"{workers:.2f} + {database:.2f} = {total:.2f} ms"


def w2_table(rounds, names, args) -> str:
    lines = [f"W2: {args.latency_jobs} one-step jobs one at a time on an idle worker, median of {len(rounds)} rounds",
             "", "| system | version | enqueued → finished in the database, p50 / p95 "
             "| enqueue → seen finished (1 ms polling), p50 / p95 |", "| --- | --- | --- | --- |"]
    for name in names:
        if _median(rounds, "w2", name, "p50_ms") is None:
            continue
        m = {key: _median(rounds, "w2", name, key) for key in ("p50_ms", "p95_ms", "client_p50_ms", "client_p95_ms")}
        lines.append(f"| {name} | {_version(rounds, 'w2', name)} | {m['p50_ms']:.1f} / {m['p95_ms']:.1f} ms "
                     f"| {m['client_p50_ms']:.1f} / {m['client_p95_ms']:.1f} ms |")
    return "\n".join(lines)


def w1_table(rounds, names, args) -> str:
    lines = [f"W1: {args.workflows} ten-step workflows, {args.processes} worker processes, median of {len(rounds)} "
             "rounds", "", "| system | version | steps/s | share of the ceiling (per round) "
             "| CPU per step: workers + PostgreSQL |", "| --- | --- | --- | --- | --- |"]
    for name in names:
        steps = _median(rounds, "w1", name, "steps_per_s")
        if steps is None or name == "ceiling":
            continue
        share = ", ".join(f"{x:.0%}" for x in _ratios(rounds, "w1", name, "steps_per_s", "ceiling", "drain_per_s"))
        workers, database = (_median(rounds, "w1", name, f"{part}_cpu_ms_per_step") for part in ("workers", "database"))
        cpu = f"{workers:.2f} + {database:.2f} = {workers + database:.2f} ms" if workers is not None else "—"
        lines.append(f"| {name} | {_version(rounds, 'w1', name)} | {steps:.0f} | {share or '—'} | {cpu} |")
    return "\n".join(lines)


def w3_table(rounds, names, args) -> str:
    lines = [f"W3: one workflow fanning out to {args.fanout} one-step items, {args.processes} worker processes, "
             f"median of {len(rounds)} rounds", "", "| system | version | start → result (database clock) | per item |",
             "| --- | --- | --- | --- |"]
    for name in names:
        seconds = _median(rounds, "w3", name, "seconds")
        if seconds is not None:
            lines.append(f"| {name} | {_version(rounds, 'w3', name)} | {seconds:.2f} s | {1000 * seconds / args.fanout:.2f} ms |")
    return "\n".join(lines)


TABLES = {"w5": w5_table, "w5-fresh": lambda rounds, names, args: w5_table(rounds, names, args, "w5-fresh"),
          "w2": w2_table, "w1": w1_table, "w3": w3_table}


if __name__ == "__main__":
    main()
