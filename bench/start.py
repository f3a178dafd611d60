"""What starting runs costs, in-process on PostgreSQL: start() one at a time, and start_many().

    DATABASE_URL=postgres://... python bench/start.py [--root DIR] [--starts 1000] [--many 20000]

Prints, as JSON: start() wall time p50/p95 (ms) and process CPU per start (µs), the same of a
django.tasks task's enqueue() (p50, CPU); start_many()
runs per second (wall) for --many runs in one call; and one commit of a one-row INSERT in plain
psycopg on the same server, p50 (ms), the floor a start() is compared with in the same run.
`--root` measures the checkout in DIR (a worktree of an older commit) with this script.

With `--against-pgqueuer`, instead: `durable.start()`, a task's `enqueue()` and PGQueuer's enqueue
(its W5 driver's, on psycopg, in its own environment under bench/.venvs/pgqueuer) interleaved on
the same server, in --blocks blocks of --block calls each, the three kinds in a turning order: each
kind's rate (calls per second of their summed wall time), p50 and CPU a call, and each block's
rate against PGQueuer's. Drift on a shared machine moves all three alike.

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
    parser.add_argument("--against-pgqueuer", action="store_true", help="interleaved with PGQueuer's enqueue")
    parser.add_argument("--blocks", type=int, default=18)
    parser.add_argument("--block", type=int, default=400)
    args = parser.parse_args()
    durable = inprocess.set_up(args.root)
    if args.against_pgqueuer:
        print(json.dumps(against_pgqueuer(durable, args.blocks, args.block)))
        return
    import psycopg
    from django.db import connection

    figures = {}
    walls, cpu = timed(lambda n: durable.start("bench.one_step"), args.starts)
    figures["start_cpu_us"] = 1e6 * cpu / args.starts
    walls.sort()
    figures["start_p50_ms"] = 1000 * statistics.median(walls)
    figures["start_p95_ms"] = 1000 * walls[int(0.95 * len(walls))]

    from bench.benchapp.tasks import one_step

    walls, cpu = timed(one_step.enqueue, args.starts)
    figures["enqueue_cpu_us"] = 1e6 * cpu / args.starts
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


def timed(call, n: int) -> tuple[list, float]:
    """call(0) ... call(n - 1): each call's wall time (s), and the process's CPU for all (s)."""
    walls, cpu = [], time.process_time()
    for i in range(n):
        began = time.perf_counter()
        call(i)
        walls.append(time.perf_counter() - began)
    return walls, time.process_time() - cpu


def against_pgqueuer(durable, blocks: int, size: int) -> dict:
    """start(), a task's enqueue() and PGQueuer's enqueue, interleaved in blocks (see the top)."""
    import os
    import subprocess
    from pathlib import Path

    from bench.benchapp.tasks import one_step

    peers = Path(__file__).resolve().parent / "peers"
    python = peers.parent / ".venvs/pgqueuer/bin/python"
    if not python.exists():
        raise SystemExit(f"--against-pgqueuer: no {python} (make bench-peers makes it)")
    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)
    pgqueuer = subprocess.Popen([str(python), str(peers / "pgqueuer_driver.py"), "enqueue-blocks"], text=True,
                                env={**os.environ, "PGQUEUER_URL": url}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert pgqueuer.stdout.readline().strip() == "ready"

    def theirs(n: int) -> tuple[list, float]:
        pgqueuer.stdin.write(f"{n}\n")
        pgqueuer.stdin.flush()
        block = json.loads(pgqueuer.stdout.readline())
        return block["walls"], block["cpu_s"]

    kinds = {"start": lambda n: timed(lambda i: durable.start("bench.one_step"), n),
             "task_enqueue": lambda n: timed(one_step.enqueue, n), "pgqueuer_enqueue": theirs}
    walls = {kind: [] for kind in kinds}
    cpu = dict.fromkeys(kinds, 0.0)
    ratios = {"start": [], "task_enqueue": []}
    try:
        for measure in kinds.values():
            measure(100)  # warm: statements prepared, connections open
        for b in range(blocks):
            order = list(kinds)[b % 3:] + list(kinds)[:b % 3]
            block = {kind: kinds[kind](size) for kind in order}
            for kind, (w, c) in block.items():
                walls[kind] += w
                cpu[kind] += c
            for kind in ratios:
                ratios[kind].append(sum(block["pgqueuer_enqueue"][0]) / sum(block[kind][0]))
    finally:
        pgqueuer.stdin.close()
        pgqueuer.wait(60)
        inprocess.empty()
    figures = {}
    for kind, w in walls.items():
        figures[f"{kind}_per_s"] = len(w) / sum(w)
        figures[f"{kind}_p50_ms"] = 1000 * statistics.median(w)
        figures[f"{kind}_cpu_us"] = 1e6 * cpu[kind] / len(w)
    for kind, r in ratios.items():
        figures[f"{kind}_vs_pgqueuer"] = figures[f"{kind}_per_s"] / figures["pgqueuer_enqueue_per_s"]
        figures[f"{kind}_blocks_ahead"] = sum(x > 1 for x in r)
        figures[f"{kind}_block_ratio_min"], figures[f"{kind}_block_ratio_max"] = min(r), max(r)
    figures["blocks"] = blocks
    return figures


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
