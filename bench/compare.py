"""Compare this checkout with an earlier commit, side by side on one PostgreSQL server.

    python bench/compare.py REF [--rounds 3]      (DATABASE_URL: any database on the server)

REF is checked out into a temporary git worktree. Each round runs REF's harness and then this
checkout's, one repetition each, every version on its own database (their schemas may differ),
so both see the same machine at nearly the same time: bench/run.py's core figures (the ceiling,
W1, W2) and, with --tasks N (default 5000, 0 to leave out), N one-step django.tasks tasks drained
by two worker processes (bench/peers/durable_driver.py's W5). Prints the medians and the change.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
FIGURES = [
    ("ceiling_rows_per_s", "ceiling: raw SKIP LOCKED, rows/s"),
    ("w1_steps_per_s", "W1 steps/s"),
    ("w1_workflows_per_s", "W1 workflows/s"),
    ("w2_p50_ms", "W2 start() to result, p50 ms"),
    ("w2_server_p50_ms", "W2 created to finished, p50 ms"),
]
TASK_FIGURES = [
    ("tasks_per_s", "one-step tasks drained/s (W5)"),
    ("tasks_cpu_ms", "one-step tasks: CPU ms per task"),
]


def database_url(base: str, name: str) -> str:
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{name}"))


def ensure_database(base: str, name: str) -> None:
    import psycopg

    admin = database_url(base, "postgres").replace("postgres://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')


def run_harness(root: Path, url: str, out: Path, args) -> dict:
    command = [sys.executable, str(root / "bench" / "run.py"), "--repeat", "1", "--json", str(out),
               "--w1-runs", str(args.w1_runs), "--w2-runs", str(args.w2_runs)]
    if "--sections" in (root / "bench" / "run.py").read_text():
        command += ["--sections", "core"]  # the figures both sides have
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(root)}
    subprocess.run(command, env=env, cwd=root, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())["median"]


def run_tasks(root: Path, url: str, jobs: int) -> dict:
    """W5 of `root`'s durable_driver.py: `jobs` one-step tasks drained by two worker processes."""
    command = [sys.executable, str(root / "bench" / "peers" / "durable_driver.py"), "--workload", "w5",
               "--jobs", str(jobs), "--processes", "2"]
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(root)}
    done = subprocess.run(command, env=env, cwd=root, check=True, capture_output=True, text=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {"tasks_per_s": figures["drain_per_s"], "tasks_cpu_ms": figures["cpu_ms_per_job"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ref")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--w1-runs", type=int, default=2000)
    parser.add_argument("--w2-runs", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=5000)
    args = parser.parse_args()
    base = os.environ["DATABASE_URL"]
    sha = subprocess.run(["git", "rev-parse", "--short", args.ref], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout.strip()
    samples: dict[str, dict[str, list[float]]] = {"ref": {}, "head": {}}
    with tempfile.TemporaryDirectory(prefix="durable-compare-") as tmp:
        worktree = Path(tmp) / "ref"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), sha], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            sides = [("ref", worktree, "bench_ref"), ("head", ROOT, "bench_head")]
            for i in range(args.rounds):
                # Alternate which side goes first, so neither always meets a warmer machine.
                for side, root, name in sides if i % 2 == 0 else sides[::-1]:
                    ensure_database(base, name)
                    figures = run_harness(root, database_url(base, name), Path(tmp) / f"{side}.json", args)
                    if args.tasks:
                        ensure_database(base, name)
                        figures.update(run_tasks(root, database_url(base, name), args.tasks))
                    for key, value in figures.items():
                        samples[side].setdefault(key, []).append(value)
                print(f"round {i + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    width = max(len(label) for _, label in FIGURES + TASK_FIGURES)
    print(f"\n{sha} against this checkout, median of {args.rounds} alternating rounds\n")
    print(f"{'figure':<{width}}  {sha:>10}  {'now':>10}  change")
    for key, label in FIGURES + (TASK_FIGURES if args.tasks else []):
        before = statistics.median(samples["ref"][key])
        after = statistics.median(samples["head"][key])
        print(f"{label:<{width}}  {before:>10.1f}  {after:>10.1f}  {100 * (after / before - 1):+.1f}%")
    ratio = [h / r for h, r in zip(samples["head"]["w1_steps_per_s"], samples["ref"]["w1_steps_per_s"])]
    print(f"\nW1 steps/s, now / {sha}, per round: " + ", ".join(f"{r:.3f}" for r in ratio)
          + f"; median {statistics.median(ratio):.3f}")
    if args.tasks:
        ratio = [h / r for h, r in zip(samples["head"]["tasks_per_s"], samples["ref"]["tasks_per_s"])]
        print(f"one-step tasks/s, now / {sha}, per round: " + ", ".join(f"{r:.3f}" for r in ratio)
              + f"; median {statistics.median(ratio):.3f}")
    for side, label in (("ref", sha), ("head", "now")):
        shares = [w / c for w, c in zip(samples[side]["w1_steps_per_s"], samples[side]["ceiling_rows_per_s"])]
        print(f"W1 as a share of its own round's ceiling, {label}: {100 * statistics.median(shares):.0f}%")


if __name__ == "__main__":
    main()
