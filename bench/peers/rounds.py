"""Interleaved rounds against the peers, on one PostgreSQL server (`make bench-peers`).

    DATABASE_URL=postgres://.../any .venv/bin/python bench/peers/rounds.py [--rounds 3] [--jobs 5000] [--processes 2]

Each round runs, one after the other on the same server: the raw SKIP LOCKED ceiling,
django-durable, and each peer whose virtual environment exists under bench/.venvs/ (made by
scripts/bench-peers.sh): Procrastinate, django-tasks-db, DBOS; each round starts with the next
system in that list. Every system gets a fresh database of its own, after a CHECKPOINT. The workload is W5: N one-step jobs enqueued one at a time (each its own commit: the
enqueue rate), then drained by P worker processes (jobs per second from the first job's start to
the last one's end, by the database's clock), with the machine's busy CPU over the drain divided
by N (workers and PostgreSQL together) and the largest worker's peak RSS. Ratios to the ceiling
and to Procrastinate are taken within each round, so a noisy machine moves both sides together;
the medians of the rounds are printed, and with --json written out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
VENVS = HERE.parent / ".venvs"

SYSTEMS = [  # (name, python, driver, extra arguments, URL style)
    ("ceiling", ROOT / ".venv/bin/python", "durable_w5.py", ["--ceiling"], "postgres"),
    ("django-durable", ROOT / ".venv/bin/python", "durable_w5.py", [], "postgres"),
    ("procrastinate", VENVS / "procrastinate/bin/python", "procrastinate_w5.py", [], "postgresql"),
    ("django-tasks-db", VENVS / "tasks-db/bin/python", "tasksdb_w5.py", [], "postgresql"),
    ("dbos", VENVS / "dbos/bin/python", "dbos_w5.py", [], "postgresql"),
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


def run_one(name, python, driver, extra, scheme, base, jobs, processes) -> dict:
    url = fresh_database(base, f"peers_{name.replace('-', '_')}")
    if scheme == "postgresql":
        url = url.replace("postgres://", "postgresql://", 1)
    env = {"DATABASE_URL": url, "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    command = [str(python), str(HERE / driver), "--url", url, "--jobs", str(jobs), "--processes", str(processes),
               *extra]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    base = os.environ["DATABASE_URL"]
    systems = [s for s in SYSTEMS if Path(s[1]).exists()]
    missing = [s[0] for s in SYSTEMS if not Path(s[1]).exists()]
    if missing:
        print(f"left out (no virtual environment; run scripts/bench-peers.sh): {', '.join(missing)}", file=sys.stderr)
    rounds = []
    for number in range(1, args.rounds + 1):
        figures = {}
        # Each round starts with another system, so that none always runs right after the same one.
        shift = (number - 1) % len(systems)
        for name, python, driver, extra, scheme in systems[shift:] + systems[:shift]:
            figures[name] = run_one(name, python, driver, extra, scheme, base, args.jobs, args.processes)
            shown = ", ".join(f"{k} {v:.1f}" for k, v in figures[name].items() if isinstance(v, float))
            print(f"round {number}: {name}: {shown}", file=sys.stderr, flush=True)
        rounds.append(figures)
    print(table(rounds, [s[0] for s in systems], args))
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "jobs": args.jobs, "processes": args.processes}, indent=1))


def table(rounds, names, args) -> str:
    def median(name, key):
        values = [r[name][key] for r in rounds if key in r.get(name, {})]
        return statistics.median(values) if values else None

    def ratios(name, key, other):
        return [r[name][key] / r[other][key] for r in rounds if key in r.get(name, {}) and key in r.get(other, {})]

    lines = [f"W5: {args.jobs} one-step jobs, {args.processes} worker processes, median of {len(rounds)} rounds",
             "", "| system | version | jobs drained/s | share of the ceiling (per round) | vs Procrastinate (per round) "
             "| machine CPU per job | enqueue/s | worker peak RSS |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in names:
        drained = median(name, "drain_per_s")
        share = ", ".join(f"{x:.0%}" for x in ratios(name, "drain_per_s", "ceiling")) if name != "ceiling" else "—"
        versus = ", ".join(f"{x:.2f}x" for x in ratios(name, "drain_per_s", "procrastinate")) \
            if "procrastinate" in names and name not in ("ceiling", "procrastinate") else "—"
        enqueue, rss = median(name, "enqueue_per_s"), median(name, "worker_peak_rss_mb")
        version = rounds[0][name].get("version", "")
        lines.append(f"| {name} | {version} | {drained:.0f} | {share} | {versus} | {median(name, 'cpu_ms_per_job'):.2f} ms "
                     f"| {f'{enqueue:.0f}' if enqueue else '—'} | {f'{rss:.0f} MB' if rss else '—'} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
