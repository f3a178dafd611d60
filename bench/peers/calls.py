"""What a job costs a worker, counted rather than timed: function calls, or instructions, a job.

    DATABASE_URL=postgres://.../any .venv/bin/python bench/peers/calls.py [--jobs 2000] [--instructions [--enqueue]]
        [--systems django-durable,django-durable-workflows,django-durable-django6,pgqueuer-asyncpg,
                   pgqueuer-asyncpg-same-python]

Times move with the machine, and on cores that are slow for Python the interpreter's work is what
a worker's CPU a job follows. So each system's worker is run twice as one process draining a
queue of one-step jobs, once with 200 and once with 200 + --jobs, under a profile hook that counts
every call (Python functions, and the C functions they call); the difference divided by --jobs is
what a job costs, with start-up and shut-down left out. Each system runs in its own environment
(bench/.venvs/, as `make bench-peers` makes them), on a fresh database of the server given. The
counting slows a worker down several times, so a worker's timed housekeeping (heartbeats, polls)
counts more here than it costs at full speed: the figure is an upper bound, the same way for all.

With --instructions, each drain runs under valgrind's callgrind instead, and what is counted is
the machine instructions the worker process executes: the interpreter, the C
extensions (asyncpg's protocol, psycopg's libpq) and the kernel's entry points aside. That is what
a worker's CPU a job is on any core, up to how many instructions a cycle the core retires, and the
kernel's work aside (system calls are not counted). Callgrind runs a worker some fifty times
slower, so a timed choice would meet other times than at full speed: django-durable's worker
stays in batches only after items under 20 ms (worker.process.QUICK_SECONDS), which under
callgrind a one-step job often is not, and the count then moved from one run to the next by a
fifth. Under callgrind that threshold is scaled by the same fifty (QUICK_UNDER_CALLGRIND), so
the worker takes the path it takes at full speed.

The count is given for the worker's main thread and for its other threads apart. The main thread
claims, runs and ends the jobs. django-durable's other thread (the maintenance thread: heartbeats,
polls) works by the clock, not by the job, and a drain under callgrind lasts fifty times longer:
there it counted 32-85 k instructions a job from one run to the next, more the busier the machine,
while the main thread's count moved by about 1 %. PGQueuer's worker has one thread (asyncio), its
timed work in it.

With --instructions --enqueue, what is counted is the process that fills the queue instead, one
job a commit as W5 enqueues them: the instructions a start costs the caller.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from rounds import ROOT, SYSTEMS, fresh_database  # noqa: E402

# The end of a `python -c` wrapper: run the script sys.argv[0] as __main__, as `python SCRIPT` would.
RUN_AS_MAIN = """
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# Run a script as __main__ with every call counted (in every thread); the counts go to a JSON file
# as the process exits: python -c COUNTER OUT SCRIPT ARGS...
COUNTER = """
import atexit, collections, json, runpy, sys, threading
out, sys.argv = sys.argv[1], sys.argv[2:]
counts = collections.Counter()
def hook(frame, event, arg):
    if event == "call":
        counts[frame.f_code.co_filename] += 1
    elif event == "c_call":
        counts["<C>"] += 1
def write():
    sys.setprofile(None)
    threading.setprofile(None)
    with open(out, "w") as f:
        json.dump(dict(counts), f)
atexit.register(write)
threading.setprofile(hook)
sys.setprofile(hook)
""" + RUN_AS_MAIN

# Each system's queue filled with N one-step jobs (run in its environment: python -c FILL N).
FILL_DURABLE = """
import os, sys
sys.path.insert(0, os.environ["DURABLE_ROOT"]); sys.path.insert(0, os.environ["DURABLE_ROOT"] + "/bench")
import run as harness
import django_durable as durable
from django.core.management import call_command
call_command("migrate", verbosity=0)
from bench.benchapp.tasks import one_step
harness.truncate()
for n in range(int(sys.argv[1])):
    durable.start("bench.one_step") if os.environ.get("WORKFLOWS") else one_step.enqueue(n)
"""
FILL_PGQUEUER = """
import os, sys
sys.path.insert(0, os.environ["PEERS"])
import pgqueuer_driver as d, psycopg
d._install()
with psycopg.connect(d.URL, autocommit=True) as connection:
    connection.execute("TRUNCATE pgqueuer, pgqueuer_log")
    enqueue = d._enqueuer(connection)
    for n in range(int(sys.argv[1])):
        enqueue(n)
"""


def _commands(system, url: str) -> tuple[str, dict, str, list[str]]:
    """How `system` runs on `url`: its python, its environment, the script that fills its queue
    (python -c FILL N) and its worker's argv (one process, draining the queue and exiting)."""
    name, python = system[0], str(system[1])
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "DURABLE_ROOT": str(ROOT), "PEERS": str(HERE)}
    if name.startswith("django-durable"):
        env.update(DATABASE_URL=url, DJANGO_SETTINGS_MODULE="bench.settings",
                   WORKFLOWS="1" if "--workflows" in system[3] else "")
        return python, env, FILL_DURABLE, [str(ROOT / "manage.py"), "durable_worker", "--burst", "-c", "1", "-v", "0"]
    env.update(PGQUEUER_URL=url.replace("postgres://", "postgresql://", 1), PYTHONPATH=str(HERE),
               PGQUEUER_DRIVER="asyncpg" if "asyncpg" in name else "psycopg")
    return python, env, FILL_PGQUEUER, [str(HERE / "pgqueuer_driver.py"), "worker", "--drain"]


def _as_is(python: str, argv: list[str]) -> list[str]:
    return [python, *argv]


def _fill(system, url: str, jobs: int, run=_as_is) -> None:
    """Fill `system`'s queue with `jobs` one-step jobs, one a commit, in a process started as
    run(python, argv) returns (by default as it is)."""
    python, env, fill, _ = _commands(system, url)
    subprocess.run(run(python, ["-c", fill, str(jobs)]), env=env, cwd=ROOT, check=True, timeout=3600,
                   capture_output=run is not _as_is)  # (a counter's own output kept off the table)


def _drain(system, url: str, run) -> None:
    """Drain `system`'s queue with one worker process, started as run(python, worker argv) returns
    (the worker wrapped in a counter)."""
    python, env, _, worker = _commands(system, url)
    subprocess.run(run(python, worker), env=env, cwd=ROOT, check=True, timeout=3600, capture_output=True)


def drained(system, url: str, jobs: int) -> collections.Counter:
    """The calls of one worker process of `system` draining `jobs` jobs, by file ("<C>": C functions)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        _fill(system, url, jobs)
        _drain(system, url, lambda python, worker: [python, "-c", COUNTER, out.name, *worker])
        return collections.Counter(json.loads(Path(out.name).read_text()))


# How many times slower callgrind runs a worker, about.
CALLGRIND_SLOWDOWN = 50

# django-durable's worker under callgrind, its quick-item threshold scaled as callgrind slows it:
# python -c QUICK_UNDER_CALLGRIND manage.py durable_worker ARGS...
QUICK_UNDER_CALLGRIND = f"""
import runpy, sys
import django
sys.argv = sys.argv[1:]
django.setup()
from django_durable.worker import process
process.QUICK_SECONDS *= {CALLGRIND_SLOWDOWN}
""" + RUN_AS_MAIN


def instructions(system, url: str, jobs: int, *, enqueue: bool = False) -> tuple[int, int]:
    """The machine instructions one worker process of `system` executes draining `jobs` jobs, as
    (its main thread's, its other threads'): the interpreter and its C extensions, under valgrind's
    callgrind, which runs it ~50x slower. With `enqueue`, those of the process that enqueues them
    (one a commit, as W5 does)."""
    with tempfile.TemporaryDirectory() as out:
        counted = Path(out) / "callgrind.out"
        grind = ["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={counted}"]
        if enqueue:
            _fill(system, url, jobs, lambda python, fill: [*grind, python, *fill])
        else:
            scaled = ["-c", QUICK_UNDER_CALLGRIND] if system[0].startswith("django-durable") else []
            _fill(system, url, jobs)
            _drain(system, url, lambda python, worker: [*grind, python, *scaled, *worker])
        # One file a thread, callgrind.out-01 (the main thread), -02, ...
        threads = [_summary(path) for path in sorted(Path(out).glob("callgrind.out-*"))]
    return threads[0], sum(threads[1:])


def _summary(path: Path) -> int:
    """The instructions one of callgrind's files counts."""
    line = next(line for line in path.read_text().splitlines() if line.startswith("summary:"))
    return int(line.split()[1])


def where(filename: str) -> str:
    """A file's package, as the table groups the calls: django_durable, psycopg, asyncio..."""
    if filename == "<C>":
        return "C functions"
    path = Path(filename)
    if str(ROOT / "django_durable") in filename:
        return "django_durable"
    if "site-packages" in path.parts:
        return path.parts[path.parts.index("site-packages") + 1]
    return "the standard library" if "python3" in filename or filename.startswith("<frozen") else "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--instructions", action="store_true", help="count machine instructions (callgrind)")
    parser.add_argument("--enqueue", action="store_true",
                        help="with --instructions: count the enqueuing process's, an enqueue (one a commit)")
    parser.add_argument("--systems", default="django-durable,django-durable-workflows,django-durable-django6,"
                                             "pgqueuer-asyncpg,pgqueuer-asyncpg-same-python")
    args = parser.parse_args()
    base = os.environ["DATABASE_URL"]
    chosen = args.systems.split(",")
    systems = [s for s in SYSTEMS if s[0] in chosen and Path(s[1]).exists()]
    if args.instructions:
        what = "an enqueue" if args.enqueue else "a job"
        print(f"| system | instructions {what}, main thread | other threads |\n| --- | --- | --- |")
    else:
        print("| system | Python calls a job | C calls a job | by package (Python calls a job) |\n| --- | --- | --- | --- |")
    for system in systems:
        url = fresh_database(base, "calls_" + "".join(c if c.isalnum() else "_" for c in system[0]))
        if args.enqueue:  # the schema made before either count (the fill migrates a fresh database)
            _fill(system, url, 0)
        if args.instructions:
            before, after = (instructions(system, url, n, enqueue=args.enqueue) for n in (200, 200 + args.jobs))
            main, others = ((a - b) / args.jobs / 1000 for a, b in zip(after, before))
            print(f"| {system[0]} | {main:.0f} k | {others:.0f} k |", flush=True)
            continue
        before, after = drained(system, url, 200), drained(system, url, 200 + args.jobs)
        groups: collections.Counter = collections.Counter()
        for filename in after:
            groups[where(filename)] += (after[filename] - before.get(filename, 0)) / args.jobs
        c_calls = groups.pop("C functions", 0.0)
        parts = ", ".join(f"{name} {count:.0f}" for name, count in groups.most_common() if count >= 0.5)
        print(f"| {system[0]} | {sum(groups.values()):.0f} | {c_calls:.0f} | {parts} |", flush=True)


if __name__ == "__main__":
    main()
