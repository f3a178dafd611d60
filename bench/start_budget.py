"""A worker's start as django-tasks-db's own worker tests meet it: running a task one second after
its spawn.

    DATABASE_URL=postgres://... .venv/bin/python bench/start_budget.py [--repeat 9]

django-tasks-db's test suite gives a worker process WORKER_STARTUP_TIME = 1 s: it enqueues a task
that sleeps, spawns the worker, sleeps that second and asserts the task is RUNNING; then
`test_interrupt_signals` sends SIGINT or SIGTERM and expects the worker to exit 0 within 2 s with
the task SUCCESSFUL, and `test_kill` sends SIGKILL and expects the task still RUNNING (its worker
gone). Each repeat here does the same with `manage.py durable_worker -c 1` (bench.settings: the
admin, the REST framework and django.tasks installed) and a `django.tasks` task on the
DurableBackend, the three endings in turn, and reads when the task's run started by the
database's clock (spawn to first claim). It prints how many repeats met each check, and the start's
median and range. A check that fails is a finding, not an error: the script exits 1 then.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run as harness  # noqa: E402  (sets Django up on bench.settings)
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

STARTUP_TIME = 1.0  # django-tasks-db's WORKER_STARTUP_TIME
ENDINGS = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


def once(ending: signal.Signals) -> dict:
    from bench.benchapp.tasks import sleep_for

    harness.truncate()
    result = sleep_for.enqueue(2)
    connections.close_all()
    spawned = time.time()
    worker = subprocess.Popen(harness.worker_command("-c", "1", "-v", "0"), env=harness.worker_env(),
                              cwd=harness.ROOT)
    try:
        time.sleep(STARTUP_TIME)
        result.refresh()
        running = result.status == "RUNNING"
        worker.send_signal(ending)
        try:
            code = worker.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        result.refresh()
        expected = ("RUNNING", -signal.SIGKILL) if ending == signal.SIGKILL else ("SUCCESSFUL", 0)
        ended = (result.status, code) == expected
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    started = harness.started_at(result.id)
    return {"running_at_1s": running, "ended_as_expected": ended, "ending": ending.name,
            "first_claim_s": None if started is None else started - spawned}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    runs = [once(ENDINGS[n % len(ENDINGS)]) for n in range(args.repeat)]
    starts = [r["first_claim_s"] for r in runs if r["first_claim_s"] is not None]
    on_time = sum(r["running_at_1s"] for r in runs)
    ended = sum(r["ended_as_expected"] for r in runs)
    print(f"running {STARTUP_TIME:g} s after the spawn: {on_time} of {len(runs)}")
    print(f"ended as django-tasks-db's tests expect (SIGINT, SIGTERM: exit 0 within 2 s, the task "
          f"SUCCESSFUL; SIGKILL: the task RUNNING): {ended} of {len(runs)}")
    if starts:
        print(f"spawn to first claim: median {statistics.median(starts):.2f} s, {min(starts):.2f}-{max(starts):.2f}"
              f" ({len(starts)} of {len(runs)} claimed it before their ending)")
    for r in runs:
        if not (r["running_at_1s"] and r["ended_as_expected"]):
            print("missed:", r)
    sys.exit(0 if on_time == ended == len(runs) else 1)


if __name__ == "__main__":
    main()
