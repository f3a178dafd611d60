"""Fair shares within a queue: one key's backlog against another key's few, fair and first-come.

    DATABASE_URL=... python bench/fairness.py --backlog 10000 --light 10 --processes 2 --rounds 3
    make bench-fairness     (a throwaway PostgreSQL; BENCH_ARGS="..." for the options)

Each round drains a backlog of `--backlog` one-step runs of the key "heavy" with `--processes`
worker processes twice, its queue fair once and first-come once (which goes first alternates from
round to round). Once a tenth of the backlog has finished, `--light` runs of the key "light" are
started one by one, as callers would. Reported for each drain:

  claims between   heavy runs claimed after the light runs were all queued, up to and including the
                   claim that took the last light run: the promise is at most one claim cycle per
                   worker, processes x DURABLE_CLAIM_BATCH
  light wait       from the last light start to the last light run's end
  runs/s           the whole drain (backlog and light runs), first claim to last end; fair against
                   first-come in the same round (the target: at least 0.8)

and what a start costs in each: 1,000 start() calls one at a time over 10 keys, and a start_many()
of 5,000 runs of one key.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

from run import ROOT, truncate, worker_command, worker_env  # noqa: I001 - run.py sets Django up

import django_durable as durable
from django.conf import settings
from django.db import connection, connections
from django.test.utils import override_settings

FAIR = {"default": {"fairness": True}}


def drain(backlog: int, light: int, processes: int, fair: bool) -> dict:
    truncate()
    queues = FAIR if fair else {}
    with override_settings(DURABLE_QUEUES=queues):
        for first in range(0, backlog, 5000):
            durable.start_many("bench.one_step", [{}] * min(5000, backlog - first), concurrency_key="heavy")
        connections.close_all()
        workers = subprocess.Popen(worker_command("--burst", "-c", str(processes), "-v", "0"),
                                   env=worker_env(DURABLE_BENCH_QUEUES=json.dumps(queues)), cwd=ROOT)
        try:
            deadline = time.monotonic() + 300
            while _count("status = 'completed'") < backlog // 10:
                if time.monotonic() > deadline or workers.poll() is not None:
                    raise RuntimeError("the workers did not finish a tenth of the backlog")
                time.sleep(0.01)
            for _ in range(light):
                durable.start("bench.one_step", concurrency_key="light")
            with connection.cursor() as cursor:
                cursor.execute("SELECT statement_timestamp()")
                (queued,) = cursor.fetchone()
            connections.close_all()
            workers.wait(timeout=600)
        finally:
            if workers.poll() is None:
                workers.kill()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT max(last_claimed_at), max(finished_at) FROM durable_workflow_run WHERE concurrency_key = 'light'")
        last_claim, last_end = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM durable_workflow_run WHERE concurrency_key = 'heavy' "
                       "AND last_claimed_at > %s AND last_claimed_at <= %s", [queued, last_claim])
        (between,) = cursor.fetchone()
        cursor.execute("SELECT count(*) FILTER (WHERE status = 'completed'), "
                       "EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM durable_workflow_run")
        completed, seconds = cursor.fetchone()
    assert completed == backlog + light, (completed, backlog + light)
    return {"claims_between": between, "light_wait_s": (last_end - queued).total_seconds(),
            "runs_per_s": completed / float(seconds)}


def start_cost(starts: int, fair: bool) -> dict:
    """Milliseconds a start() takes, one at a time over 10 keys, and a start_many() of 5,000 runs."""
    truncate()
    with override_settings(DURABLE_QUEUES=FAIR if fair else {}):
        began = time.perf_counter()
        for n in range(starts):
            durable.start("bench.one_step", concurrency_key=f"key:{n % 10}")
        one = (time.perf_counter() - began) * 1000 / starts
        began = time.perf_counter()
        durable.start_many("bench.one_step", [{}] * 5000, concurrency_key="many")
        many = (time.perf_counter() - began) * 1000
    return {"start_ms": one, "start_many_ms": many}


def _count(condition: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM durable_workflow_run WHERE {condition}")
        return cursor.fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--light", type=int, default=10)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    cycle = args.processes * settings.DURABLE_CLAIM_BATCH
    print(f"backlog {args.backlog} heavy, then {args.light} light; {args.processes} worker processes, "
          f"DURABLE_CLAIM_BATCH {settings.DURABLE_CLAIM_BATCH} (one claim cycle per worker: {cycle} claims)")
    rows = {True: [], False: []}
    for round_ in range(1, args.rounds + 1):
        for fair in ((True, False) if round_ % 2 else (False, True)):
            result = drain(args.backlog, args.light, args.processes, fair)
            rows[fair].append(result)
            print(f"round {round_}: {'fair' if fair else 'first-come'}: {result['claims_between']} claims between, "
                  f"light wait {result['light_wait_s']:.3f} s, {result['runs_per_s']:.0f} runs/s", flush=True)
        for fair in ((True, False) if round_ % 2 else (False, True)):
            cost = start_cost(1000, fair)
            rows[fair][-1].update(cost)
            print(f"round {round_}: {'fair' if fair else 'first-come'}: start() {cost['start_ms']:.2f} ms, "
                  f"start_many() of 5,000 {cost['start_many_ms']:.0f} ms", flush=True)
    ratios = [f["runs_per_s"] / u["runs_per_s"] for f, u in zip(rows[True], rows[False])]
    for fair, name in ((True, "fair"), (False, "first-come")):
        results = rows[fair]
        print(f"{name}: claims between {statistics.median(r['claims_between'] for r in results):.0f} (median; "
              f"most {max(r['claims_between'] for r in results)}), light wait median "
              f"{statistics.median(r['light_wait_s'] for r in results):.3f} s, "
              f"{statistics.median(r['runs_per_s'] for r in results):.0f} runs/s; start() "
              f"{statistics.median(r['start_ms'] for r in results):.2f} ms, start_many() of 5,000 "
              f"{statistics.median(r['start_many_ms'] for r in results):.0f} ms")
    print("fair / first-come throughput per round: " + ", ".join(f"{ratio:.2f}" for ratio in ratios)
          + f" (median {statistics.median(ratios):.2f}); claims between, fair, within one cycle ({cycle}): "
          + ("yes" if all(r["claims_between"] <= cycle for r in rows[True]) else "NO"))


if __name__ == "__main__":
    main()
