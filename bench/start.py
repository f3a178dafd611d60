"""What starting runs costs, in-process on PostgreSQL: start() one at a time, and start_many().

    DATABASE_URL=postgres://... python bench/start.py [--root DIR] [--starts 1000] [--many 20000]

Prints, as JSON: start() wall time p50/p95 (ms) and process CPU per start (µs), the same of a
django.tasks task's enqueue() (p50, CPU); start_many()
runs per second (wall) for --many runs in one call; and one commit of a one-row INSERT in plain
psycopg on the same server, p50 (ms), the floor a start() is compared with in the same run.
`--root` measures the checkout in DIR (a worktree of an older commit) with this script.

With `--layers`, also where an enqueue's CPU goes, layer by layer (µs a call, the best of five):
each layer with the start's one statement replaced by a stand-in that answers at once (what
Python does around the statement: `Task.enqueue()`, the backend's `enqueue()`, `create_run()`,
`start()`), then the statement itself through the hot-statement path, through Django's cursor
wrapper, and on psycopg's own cursor. The statement's share is the server's round trip and
psycopg's; the rest is this project's and django.tasks' Python, which slower cores slow most.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import inprocess  # bench/, on the path as this script's folder


def main() -> None:
    parser = inprocess.parser(__doc__)
    parser.add_argument("--starts", type=int, default=1000)
    parser.add_argument("--many", type=int, default=20000)
    parser.add_argument("--layers", action="store_true", help="an enqueue's CPU, layer by layer")
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
    if args.layers:
        figures.update(layers(durable, args.starts))
    print(json.dumps({key: round(value, 3) for key, value in figures.items()}))


def layers(durable, calls: int) -> dict:
    """The CPU (µs) of an enqueue's layers: around its statement (stood in for), and the statement."""
    import datetime as dt

    from django_durable import partitioning, tasks
    from django_durable.ids import uuid7
    from django_durable.workpool import runs, statements

    from bench.benchapp.tasks import one_step

    if not hasattr(runs, "_start_sql") or partitioning.runs.layout("default") is not None:
        # (an older checkout's start has other parts; a partitioned one's statement takes the key too)
        print("--layers: not measured (this checkout's start has another shape)", file=sys.stderr)
        return {}

    backend, definition = one_step.get_backend(), tasks._register(one_step)
    one_step.enqueue(0)  # the statement's text, assembled at the first start
    sql = next(iter(runs._start_sql.values()))
    figures = {}

    def best(name: str, call, n: int) -> None:
        rounds = []
        for _ in range(5):
            inprocess.empty()
            began = time.process_time()
            for _ in range(n):
                call()
            rounds.append(time.process_time() - began)
        figures[f"{name}_cpu_us"] = 1e6 * min(rounds) / n

    now, execute = dt.datetime.now(dt.timezone.utc), statements.execute
    statements.execute = lambda db, text, params: ((1, now), 1)
    try:
        best("around_statement_task_enqueue", lambda: one_step.enqueue(1), 10 * calls)
        best("around_statement_backend_enqueue", lambda: backend.enqueue(one_step, (1,), {}), 10 * calls)
        best("around_statement_create_run",
             lambda: runs.create_run(definition, [1], {}, queue="default", priority=0, run_at=None), 10 * calls)
        best("around_statement_start", lambda: durable.start("bench.one_step"), 10 * calls)
    finally:
        statements.execute = execute

    def params() -> list:
        return [uuid7(), definition.name, '{"args":[1],"kwargs":{}}', 1, "default", 0, ""]

    from django.db import connections

    _, text, _ = statements._cursor("default", sql)
    # The connection's kept cursor for this statement, in Django's wrapper and without it.
    wrapper = statements._kept[connections["default"].connection][False]
    best("statement_hot_path", lambda: statements.execute("default", sql, params()), calls)
    best("statement_django_cursor", lambda: (wrapper.execute(text, params()), wrapper.fetchone()), calls)
    best("statement_psycopg_cursor", lambda: (wrapper.cursor.execute(text, params(), prepare=True),
                                              wrapper.cursor.fetchone()), calls)
    return figures


if __name__ == "__main__":
    main()
