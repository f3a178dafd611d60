"""What starting runs costs, in-process on PostgreSQL: start() one at a time, and start_many().

    DATABASE_URL=postgres://... python bench/start.py [--root DIR] [--starts 1000] [--many 20000]

Prints, as JSON: start() wall time p50/p95 (ms) and process CPU per start (µs), the same of a
django.tasks task's enqueue() (p50, CPU); start_many()
runs per second (wall) for --many runs in one call; and one commit of a one-row INSERT in plain
psycopg on the same server, p50 (ms), the floor a start() is compared with in the same run.
`--root` measures the checkout in DIR (a worktree of an older commit) with this script.
"""

from __future__ import annotations

import json
import statistics
import time

import inprocess  # bench/, on the path as this script's folder


def main() -> None:
    parser = inprocess.parser(__doc__)
    parser.add_argument("--starts", type=int, default=1000)
    parser.add_argument("--many", type=int, default=20000)
    args = parser.parse_args()
    durable = inprocess.set_up(args.root)
    import psycopg
    from django.db import connection

    figures = {}
    walls = []
    cpu = time.process_time()
    for _ in range(args.starts):
        began = time.perf_counter()
        durable.start("bench.one_step")
        walls.append(time.perf_counter() - began)
    figures["start_cpu_us"] = 1e6 * (time.process_time() - cpu) / args.starts
    walls.sort()
    figures["start_p50_ms"] = 1000 * statistics.median(walls)
    figures["start_p95_ms"] = 1000 * walls[int(0.95 * len(walls))]

    from bench.benchapp.tasks import one_step

    walls, cpu = [], time.process_time()
    for n in range(args.starts):
        began = time.perf_counter()
        one_step.enqueue(n)
        walls.append(time.perf_counter() - began)
    figures["enqueue_cpu_us"] = 1e6 * (time.process_time() - cpu) / args.starts
    figures["enqueue_p50_ms"] = 1000 * statistics.median(walls)

    start_many = getattr(durable, "start_many", None)
    if start_many is not None:
        calls = [{} for _ in range(args.many)]
        began = time.perf_counter()
        start_many("bench.one_step", calls)
        figures["start_many_runs_per_s"] = args.many / (time.perf_counter() - began)

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as raw:
        # A logged table (a temporary one would skip the WAL flush a real commit waits for).
        raw.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial PRIMARY KEY, payload text)")
        try:
            commits = []
            for _ in range(args.starts):
                began = time.perf_counter()
                raw.execute("INSERT INTO bench_floor (payload) VALUES (%s)", ["{}"])
                commits.append(time.perf_counter() - began)
            figures["one_commit_p50_ms"] = 1000 * statistics.median(commits)
        finally:
            raw.execute("DROP TABLE bench_floor")
    print(json.dumps({key: round(value, 3) for key, value in figures.items()}))


if __name__ == "__main__":
    main()
