"""What a queue's concurrency limit costs: one-step runs drained with and without one, interleaved.

    DATABASE_URL=... python bench/limits.py --runs 5000 --processes 2 --rounds 3

Each round drains the same backlog of one-step runs (bench/run.py's W1 with one step) three
ways: no limits; a concurrency limit on the queue at the number of worker processes (it binds
as soon as every worker is busy); and a generous one (100, which never binds but is checked at
every claim). The issue's target: with a limit, at least 70% of the unlimited throughput.
"""

from __future__ import annotations

import argparse
import json
import statistics

from run import w1  # noqa: I001 - run.py sets Django up

CASES = {
    "unlimited": {},
    "concurrency = processes": None,  # filled in from --processes
    "concurrency 100": {"default": {"concurrency": 100}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    cases = dict(CASES, **{"concurrency = processes": {"default": {"concurrency": args.processes}}})
    figures = {name: [] for name in cases}
    for round_ in range(1, args.rounds + 1):
        for name, limits in cases.items():
            result = w1(args.runs, 1, args.processes, DURABLE_BENCH_QUEUES=json.dumps(limits))
            figures[name].append(result["workflows_per_s"])
            print(f"round {round_}: {name}: {result['workflows_per_s']:.0f} runs/s", flush=True)
    base = figures["unlimited"]
    for name, values in figures.items():
        ratios = [value / unlimited for value, unlimited in zip(values, base)]
        print(f"{name}: median {statistics.median(values):.0f} runs/s; per-round ratio to unlimited "
              + ", ".join(f"{ratio:.2f}" for ratio in ratios))


if __name__ == "__main__":
    main()
