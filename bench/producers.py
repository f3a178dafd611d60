"""Many producers (RELIABILITY T45): web processes starting runs and enqueuing tasks at once while
workers drain, with a NOTIFY per start and without.

    DATABASE_URL=postgres://... python bench/producers.py [--producers 16,32,64] [--seconds 5]
        [--workers 2] [--rounds 1] [--root DIR]

For each number of producers and each mode, the tables are emptied, `--workers` worker processes
started, and that many producer processes call `durable.start("bench.one_step")` and
`one_step.enqueue(n)` in turn, as fast as they can, for `--seconds`. Then the workers drain what
is left. Printed, as JSON lines and a table: starts per second (all producers), a start's latency
p50 and p95 (ms), and whether every start was drained (completed == started).

Modes: ``notify`` (the default settings: each start wakes idle workers by NOTIFY) and
``silent`` (DURABLE_LISTEN_NOTIFY off in the producers: no NOTIFY; workers find work by polling,
or by claiming again as they finish). `--root` measures the checkout in DIR with this script.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def produce(root: str, mode: str, seconds: float, ready, begin, results) -> None:
    """One producer process: once `begin` (time.time()) is set and has come, start and enqueue in
    turn for `seconds`; report the latencies."""
    sys.path.insert(0, root)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["DURABLE_LISTEN_NOTIFY"] = "1" if mode == "notify" else "0"
    import django

    django.setup()
    import django_durable as durable
    from bench.benchapp.tasks import one_step
    from django.db import connection

    connection.ensure_connection()
    durable.start("bench.one_step")  # the first of a process prepares its statements: not counted
    ready.release()
    while not begin.value or time.time() < begin.value:  # the common start, set by the parent
        time.sleep(0.001)
    until = begin.value + seconds
    latencies, n = [], 0
    while time.time() < until:
        began = time.perf_counter()
        if n % 2:
            one_step.enqueue(n)
        else:
            durable.start("bench.one_step")
        latencies.append(time.perf_counter() - began)
        n += 1
    connection.close()
    results.put(latencies)


def round_of(root: Path, producers: int, mode: str, seconds: float, workers: int) -> dict:
    from django.db import connection, connections

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", "PYTHONPATH": str(root)}
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE durable_step, durable_work_item, durable_timer, durable_signal, "
                       "durable_workflow_event, durable_workflow_run CASCADE")
    connections.close_all()
    pool = [subprocess.Popen([sys.executable, str(root / "manage.py"), "durable_worker", "-c", "1", "-v", "0"],
                             env=env, cwd=root) for _ in range(workers)]
    context = multiprocessing.get_context("spawn")
    ready, begin, results = context.Semaphore(0), context.Value("d", 0.0), context.Queue()
    procs = [context.Process(target=produce, args=(str(root), mode, seconds, ready, begin, results))
             for _ in range(producers)]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:  # every producer set up and connected
            if not ready.acquire(timeout=120):
                raise RuntimeError("a producer did not start")
        begin.value = time.time() + 0.5
        latencies = []
        for _ in procs:
            latencies.extend(results.get(timeout=seconds + 120))
        for proc in procs:
            proc.join(timeout=60)
        started = len(latencies) + producers  # and the one each made before the clock
        from django_durable.models import WorkflowRun

        deadline = time.monotonic() + 300
        completed = 0
        while time.monotonic() < deadline:
            completed = WorkflowRun.objects.filter(status="completed").count()
            if completed >= started:
                break
            time.sleep(0.5)
        connections.close_all()
    finally:
        for worker in pool:
            worker.terminate()
        for worker in pool:
            worker.wait(timeout=60)
    latencies.sort()
    return {"producers": producers, "mode": mode, "starts_per_s": len(latencies) / seconds,
            "p50_ms": 1000 * statistics.median(latencies), "p95_ms": 1000 * latencies[int(0.95 * len(latencies))],
            "started": started, "completed": completed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=HERE.parent)
    parser.add_argument("--producers", default="16,32,64")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="notify,silent")
    args = parser.parse_args()
    root = args.root.resolve()
    sys.path.insert(0, str(root))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    print(f"measuring {root}", file=sys.stderr)
    rows = []
    for _ in range(args.rounds):
        for producers in [int(p) for p in args.producers.split(",")]:
            for mode in args.modes.split(","):
                row = round_of(root, producers, mode, args.seconds, args.workers)
                print(json.dumps(row), flush=True)
                rows.append(row)
    print(f"{'producers':>9} {'mode':>7} {'starts/s':>9} {'p50 ms':>7} {'p95 ms':>7} {'drained':>8}")
    for row in rows:
        print(f"{row['producers']:>9} {row['mode']:>7} {row['starts_per_s']:>9.0f} {row['p50_ms']:>7.2f} "
              f"{row['p95_ms']:>7.2f} {str(row['completed'] >= row['started']):>8}")


if __name__ == "__main__":
    main()
