"""The benchmark harness: `python bench/run.py` prints a table of throughput, latency and query counts.

Runs on PostgreSQL (DATABASE_URL). Every figure is the median of --repeat runs, and the raw
SKIP LOCKED ceiling is measured in the same run, so ratios hold on a noisy shared machine.

  ceiling  plain psycopg, N processes, each claiming and completing one row per commit
           (ratios to it are taken within each run, then the median of the ratios)
  W1       2,000 workflows of 10 trivial steps enqueued up front, N worker processes
  W2       200 one-step workflows started one at a time on an idle worker: start() to result
"""

from __future__ import annotations

import argparse
import compileall
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Every process of the harness, and the workers it spawns, start from compiled bytecode, as an
# installed wheel does (pip compiles it): in a checkout whose .pyc files are stale, under
# PYTHONDONTWRITEBYTECODE, each process would compile django-durable's sources again (a worker's
# django.setup() took 1.83 G instructions so, against 1.62 G).
compileall.compile_dir(ROOT / "django_durable", quiet=1)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

import django_durable as durable  # noqa: E402
from django_durable import workpool  # noqa: E402
from django_durable.engine.replay import advance  # noqa: E402

DURABLE_TABLES = ("durable_step, durable_work_item, durable_timer, durable_signal, durable_workflow_event, durable_fair_turn, "
                  "durable_workflow_run")


def psycopg_url() -> str:
    return os.environ["DATABASE_URL"].replace("postgres://", "postgresql://", 1)


def truncate() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {DURABLE_TABLES} CASCADE")
        cursor.execute("VACUUM ANALYZE durable_work_item")


def started_at(run_id) -> float | None:
    """When run `run_id` started (its first claim), epoch seconds by the database's clock; None if never."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXTRACT(EPOCH FROM started_at) FROM durable_workflow_run WHERE id = %s", [run_id])
        (started,) = cursor.fetchone()
    return None if started is None else float(started)


# -- the ceiling: a raw SKIP LOCKED queue in plain psycopg ---------------------------------------


# The fastest one-row loop there is: one statement a row, in autocommit (one round trip).
ONE_STATEMENT = ("UPDATE bench_raw SET status = 'done' WHERE id = (SELECT id FROM bench_raw WHERE status = 'pending' "
                 "ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id")


def _raw_worker(url, barrier, results, loop):
    import psycopg

    # Through a transaction pooler (DURABLE_BENCH_POOLED=1) statements go unprepared, as the
    # pooler cannot keep them between transactions.
    pooled = os.environ.get("DURABLE_BENCH_POOLED") == "1"
    with psycopg.connect(url, autocommit=loop == "one-statement",
                         **({"prepare_threshold": None} if pooled else {})) as conn:
        barrier.wait()
        done, started = 0, time.perf_counter()
        while True:
            if loop == "one-statement":
                if conn.execute(ONE_STATEMENT).fetchone() is None:
                    break
            else:  # four round trips a row: BEGIN, SELECT ... FOR UPDATE SKIP LOCKED, UPDATE, COMMIT
                with conn.transaction():
                    row = conn.execute(
                        "SELECT id FROM bench_raw WHERE status = 'pending' ORDER BY id "
                        "LIMIT 1 FOR UPDATE SKIP LOCKED"
                    ).fetchone()
                    if row is None:
                        break
                    conn.execute("UPDATE bench_raw SET status = 'done' WHERE id = %s", row)
            done += 1
        results.put((done, time.perf_counter() - started))


def raw_ceiling(rows: int, processes: int, loop: str = "one-statement") -> float:
    """Rows per second that `processes` plain psycopg loops claim and complete: one statement a row
    in autocommit (`loop="one-statement"`, the ceiling), or a transaction of a SELECT ... FOR
    UPDATE SKIP LOCKED and an UPDATE ("four-trips", the loop of earlier measurements)."""
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_raw")
        cursor.execute("CREATE TABLE bench_raw (id bigserial PRIMARY KEY, status text NOT NULL, payload text)")
        cursor.execute("CREATE INDEX bench_raw_pending ON bench_raw (id) WHERE status = 'pending'")
        cursor.execute(
            "INSERT INTO bench_raw (status, payload) SELECT 'pending', 'x' FROM generate_series(1, %s)", [rows]
        )
        cursor.execute("VACUUM ANALYZE bench_raw")
    connections.close_all()
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_raw_worker, args=(psycopg_url(), barrier, results, loop))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join()
    total = sum(done for done, _ in outcomes)
    assert total == rows, (total, rows)
    return total / max(elapsed for _, elapsed in outcomes)


# -- W1: throughput of enqueued workflows ----------------------------------------------------------


def worker_command(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), "durable_worker", *args]


def worker_env(**extra: str) -> dict:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.settings", **extra}


def w1(runs: int, steps: int, processes: int, **env: str) -> dict:
    truncate()
    for _ in range(runs):
        durable.start("bench.ten_steps", n=steps)
    connections.close_all()
    command = worker_command("--burst", "-c", str(processes), "-v", "0")
    subprocess.run(command, env=worker_env(**env), check=True, cwd=ROOT)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'), "
            "EXTRACT(EPOCH FROM max(finished_at) - min(started_at)) FROM durable_workflow_run"
        )
        completed, elapsed = cursor.fetchone()
        cursor.execute("SELECT count(*) FROM durable_step")
        (recorded,) = cursor.fetchone()
    assert completed == runs and recorded == runs * steps, (completed, recorded)
    elapsed = float(elapsed)
    return {"workflows_per_s": runs / elapsed, "steps_per_s": runs * steps / elapsed, "seconds": elapsed}


def dead_tuples() -> int:
    time.sleep(1.5)  # the statistics arrive from the backends within a second
    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables "
                       "WHERE relname IN ('durable_work_item', 'durable_workflow_run')")
        return int(cursor.fetchone()[0])


def t30_long_reader(runs: int, processes: int) -> dict:
    """RELIABILITY T30: W1 while a REPEATABLE READ transaction holds its snapshot, then after it ends.

    The held snapshot keeps every row version the workers replace from being vacuumed away:
    measure the throughput and the dead rows left, with and without it.
    """
    import psycopg

    reader = psycopg.connect(psycopg_url(), autocommit=True)
    try:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT 1").fetchone()  # the snapshot is taken here and held
        during = w1(runs, 10, processes)
        dead_during = dead_tuples()
    finally:
        reader.execute("ROLLBACK")
        reader.close()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM durable_work_item, durable_workflow_run")
    dead_vacuumed = dead_tuples()
    after = w1(runs, 10, processes)
    return {"steps_per_s_held": during["steps_per_s"], "steps_per_s_after": after["steps_per_s"],
            "dead_rows_held": dead_during, "dead_rows_after_vacuum": dead_vacuumed}


# -- W2: latency of one workflow on an idle worker -------------------------------------------------


def w2(runs: int) -> dict:
    truncate()
    connections.close_all()
    worker = subprocess.Popen(worker_command("-c", "1", "-v", "0"), env=worker_env(), cwd=ROOT)
    try:
        time.sleep(2.0)  # started and listening
        client, server = [], []
        for _ in range(runs):
            started = time.perf_counter()
            run = durable.start("bench.one_step")
            durable.wait(run.pk, timeout=30)
            client.append(time.perf_counter() - started)
        with connection.cursor() as cursor:
            cursor.execute("SELECT EXTRACT(EPOCH FROM finished_at - created_at) FROM durable_workflow_run")
            server = [float(row[0]) for row in cursor.fetchall()]
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    return {
        "p50_ms": 1000 * statistics.median(client),
        "p95_ms": 1000 * quantile(client, 0.95),
        "server_p50_ms": 1000 * statistics.median(server),
        "server_p95_ms": 1000 * quantile(server, 0.95),
    }


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# -- W4: many timers due at once; W5: signal round trip ------------------------------------------


def w4_timers(runs: int, processes: int) -> dict:
    """`runs` runs sleep until one instant; seconds from it until the last of them completed."""
    import datetime as dt

    from django.utils import timezone

    truncate()
    at = timezone.now() + dt.timedelta(days=1)  # moved closer once every run sleeps
    for _ in range(runs):
        durable.start("bench.sleep_until", at)
    connections.close_all()
    worker = subprocess.Popen(worker_command("-c", str(processes), "-v", "0"), env=worker_env(), cwd=ROOT)
    try:
        from django_durable.models import Step, Timer, WorkflowRun

        while WorkflowRun.objects.filter(status="waiting").count() < runs:
            time.sleep(0.5)
        # All asleep: make the instant two seconds from now, on the database's clock.
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp() + interval '2 seconds'")
            (instant,) = cursor.fetchone()
        Timer.objects.filter(status="pending").update(fire_at=instant)
        Step.objects.filter(key="nap").update(deadline_at=instant)
        while WorkflowRun.objects.filter(status="completed").count() < runs:
            time.sleep(0.2)
        with connection.cursor() as cursor:
            cursor.execute("SELECT EXTRACT(EPOCH FROM max(finished_at) - %s) FROM durable_workflow_run", [instant])
            (seconds,) = cursor.fetchone()
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    return {"all_resumed_s": float(seconds)}


def w5_signals(runs: int) -> dict:
    """p50 from durable.signal() to the waiting run's next step completing, on an idle worker."""
    from django_durable.models import WorkflowRun

    truncate()
    connections.close_all()
    worker = subprocess.Popen(worker_command("-c", "1", "-v", "0"), env=worker_env(), cwd=ROOT)
    try:
        waiting = [durable.start("bench.wait_signal") for _ in range(runs)]
        while WorkflowRun.objects.filter(status="waiting").count() < runs:
            time.sleep(0.1)
        time.sleep(1.0)
        client = []
        for run in waiting:
            started = time.perf_counter()
            durable.signal(run.pk, "ping", 1)
            durable.wait(run.pk, timeout=30)
            client.append(time.perf_counter() - started)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT EXTRACT(EPOCH FROM r.finished_at - m.created_at) FROM durable_workflow_run r "
                "JOIN durable_signal m ON m.run_id = r.id"
            )
            server = [float(row[0]) for row in cursor.fetchall()]
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    return {"p50_ms": 1000 * statistics.median(client), "p95_ms": 1000 * quantile(client, 0.95),
            "server_p50_ms": 1000 * statistics.median(server)}


def w3_fanout(sizes: list[int], processes: int) -> dict:
    """Seconds from start() to the result of one workflow mapping over n trivial items."""
    truncate()
    connections.close_all()
    worker = subprocess.Popen(worker_command("-c", str(processes), "-v", "0"), env=worker_env(), cwd=ROOT)
    figures = {}
    try:
        time.sleep(2.0)  # started and listening
        for n in sizes:
            started = time.perf_counter()
            run = durable.start("bench.fanout", n)
            assert durable.wait(run.pk, timeout=600) == n
            figures[f"{n}_s"] = time.perf_counter() - started
            figures[f"{n}_ms_per_item"] = 1000 * figures[f"{n}_s"] / n
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    return figures


def w6_schedules(count: int, processes: int, minutes: int) -> dict:
    """`count` schedules firing every minute: the scheduler's cost per minute, and the lateness of runs."""
    import datetime as dt

    from django.db import connection as conn
    from django.utils import timezone

    from django_durable import schedules
    from django_durable.models import Schedule, WorkflowRun
    from django_durable.testing import clock

    truncate()
    Schedule.objects.all().delete()
    # The cost of a scheduler tick that starts `count` runs, measured in this process with a
    # frozen clock moved a minute at a time.
    start = timezone.now().replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    with clock(start) as frozen:
        for i in range(count):
            schedules.ensure_schedule(f"s{i}", "bench.one_step", cron="* * * * *")
        cpu, wall, queries = [], [], []
        for _ in range(3):
            frozen.advance(minutes=1)
            with CaptureQueriesContext(conn) as captured:
                began, began_cpu = time.perf_counter(), time.process_time()
                assert schedules.tick(db="default") == count
                wall.append(time.perf_counter() - began)
                cpu.append(time.process_time() - began_cpu)
            queries.append(len(captured.captured_queries))
    truncate()
    Schedule.objects.all().delete()
    # Lateness with real workers: from each fire time to its run's start.
    for i in range(count):
        schedules.ensure_schedule(f"s{i}", "bench.one_step", cron="* * * * *")
    connections.close_all()
    worker = subprocess.Popen(worker_command("-c", str(processes), "-v", "0"), env=worker_env(), cwd=ROOT)
    try:
        deadline = time.monotonic() + 60 * (minutes + 1) + 30
        while time.monotonic() < deadline:
            fired = WorkflowRun.objects.exclude(started_at=None).count()
            if fired >= count * minutes:
                break
            time.sleep(1)
        late = [
            (r.started_at - r.scheduled_at).total_seconds()
            for r in WorkflowRun.objects.exclude(started_at=None).only("started_at", "scheduled_at")
        ]
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        Schedule.objects.all().delete()
    return {
        "tick_wall_s": statistics.median(wall), "tick_cpu_s": statistics.median(cpu),
        "tick_queries": statistics.median(queries),
        "late_p50_ms": 1000 * statistics.median(late), "late_p95_ms": 1000 * quantile(late, 0.95),
        "runs": len(late),
    }


# -- queries per step and per claim ------------------------------------------------------------------


def query_counts() -> dict:
    truncate()
    commits = {"n": 0}
    real_commit = connection._commit

    def counting_commit(*args, **kwargs):
        commits["n"] += 1
        return real_commit(*args, **kwargs)

    def measure(steps):
        durable.start("bench.ten_steps", n=steps)
        connection._commit = counting_commit
        commits["n"] = 0
        try:
            with CaptureQueriesContext(connection) as captured:
                advance(workpool.claim(worker="bench", queues=None, db="default"))
        finally:
            connection._commit = real_commit
        return len(captured.captured_queries), commits["n"]

    measure(10)  # warm up: the claim's locking query is compiled once per process
    ten, ten_commits = measure(10)
    twenty, _ = measure(20)
    durable.start("bench.one_step")
    with CaptureQueriesContext(connection) as captured:
        claim = workpool.claim(worker="bench", queues=None, db="default")
    assert claim is not None
    truncate()
    per_step = (twenty - ten) / 10
    return {
        "per_step": per_step,
        "per_claim": len(captured.captured_queries),
        "per_10_step_workflow": ten,
        # In autocommit every statement is its own transaction; explicit ones add their BEGIN
        # and COMMIT to the count of statements.
        "explicit_transactions_per_workflow": ten_commits,
    }


# -- the table -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--w1-runs", type=int, default=2000)
    parser.add_argument("--w2-runs", type=int, default=200)
    parser.add_argument("--raw-rows", type=int, default=10000)
    parser.add_argument("--timer-runs", type=int, default=10000)
    parser.add_argument("--signal-runs", type=int, default=200)
    parser.add_argument("--fanout", default="500,5000", help="W3's fan-out sizes")
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--schedule-minutes", type=int, default=2)
    parser.add_argument("--admin-runs", type=int, default=100_000)
    parser.add_argument("--sections", default="core,fanout,timers,signals",
                        help="comma-separated: core (ceiling, W1, W2), fanout (W3), timers (W4), signals (W5), "
                             "schedules (W6, several minutes), reader (T30: W1 under a long REPEATABLE READ reader), "
                             "admin (the dashboard on --admin-runs runs, once), "
                             "api (the REST API on the same table)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    if connection.vendor != "postgresql":
        sys.exit("The benchmarks run on PostgreSQL: set DATABASE_URL to a postgres:// URL.")
    call_command("migrate", verbosity=0)

    sections = set(args.sections.split(","))
    samples: dict[str, list[float]] = {}
    for i in range(args.repeat):
        figures = {}
        if "core" in sections:
            figures["ceiling_rows_per_s"] = raw_ceiling(args.raw_rows, args.processes)
            figures.update({f"w1_{k}": v for k, v in w1(args.w1_runs, 10, args.processes).items()})
            figures["w1_vs_ceiling"] = figures["w1_steps_per_s"] / figures["ceiling_rows_per_s"]
            unprepared = w1(args.w1_runs, 10, args.processes, DURABLE_PREPARED_STATEMENTS="0")
            figures["w1_unprepared_steps_per_s"] = unprepared["steps_per_s"]
            figures["w1_unprepared_vs_ceiling"] = unprepared["steps_per_s"] / figures["ceiling_rows_per_s"]
            figures.update({f"w2_{k}": v for k, v in w2(args.w2_runs).items()})
        if "fanout" in sections:
            sizes = [int(n) for n in args.fanout.split(",")]
            figures.update({f"w3_{k}": v for k, v in w3_fanout(sizes, args.processes).items()})
        if "timers" in sections:
            figures.update({f"w4_{k}": v for k, v in w4_timers(args.timer_runs, args.processes).items()})
        if "signals" in sections:
            figures.update({f"w5_{k}": v for k, v in w5_signals(args.signal_runs).items()})
        if "reader" in sections:
            figures.update({f"t30_{k}": v for k, v in t30_long_reader(args.w1_runs, args.processes).items()})
        if "schedules" in sections:
            figures.update({f"w6_{k}": v for k, v in
                            w6_schedules(args.schedules, args.processes, args.schedule_minutes).items()})
        for key, value in figures.items():
            samples.setdefault(key, []).append(value)
        print(f"run {i + 1}/{args.repeat}: " + ", ".join(f"{k}={v:.2f}" for k, v in figures.items()), file=sys.stderr)
    median = {key: statistics.median(values) for key, values in samples.items()}
    if sections & {"admin", "api"}:
        from bench.admin_pages import pages

        median.update({f"pages_{k}": v for k, v in
                       pages(args.admin_runs, admin="admin" in sections, api="api" in sections).items()})
    queries = query_counts()

    rows = []
    if "core" in sections:
        rows += [
            ("ceiling: raw SKIP LOCKED, rows/s", f"{median['ceiling_rows_per_s']:.0f}"),
            ("W1 workflows/s", f"{median['w1_workflows_per_s']:.0f}"),
            ("W1 steps/s", f"{median['w1_steps_per_s']:.0f}"),
            ("W1 steps/s as a share of the ceiling", f"{100 * median['w1_vs_ceiling']:.0f}%"),
            ("W1 steps/s, statements unprepared (pooler)", f"{median['w1_unprepared_steps_per_s']:.0f}"),
            ("  as a share of the ceiling", f"{100 * median['w1_unprepared_vs_ceiling']:.0f}%"),
            ("W2 start() to result, p50", f"{median['w2_p50_ms']:.1f} ms"),
            ("W2 start() to result, p95", f"{median['w2_p95_ms']:.1f} ms"),
            ("W2 created to finished (database), p50", f"{median['w2_server_p50_ms']:.1f} ms"),
            ("W2 created to finished (database), p95", f"{median['w2_server_p95_ms']:.1f} ms"),
        ]
    if "fanout" in sections:
        for n in args.fanout.split(","):
            rows.append((f"W3 map over {n} items, start() to result", f"{median[f'w3_{n}_s']:.2f} s"))
            rows.append(("   per item", f"{median[f'w3_{n}_ms_per_item']:.2f} ms"))
    if "timers" in sections:
        rows.append((f"W4 {args.timer_runs} sleepers due at once: all resumed in", f"{median['w4_all_resumed_s']:.1f} s"))
    if "signals" in sections:
        rows += [
            ("W5 signal() to the next step done, p50", f"{median['w5_p50_ms']:.1f} ms"),
            ("W5 signal() to the next step done, p95", f"{median['w5_p95_ms']:.1f} ms"),
            ("W5 signal stored to run finished (database), p50", f"{median['w5_server_p50_ms']:.1f} ms"),
        ]
    if "reader" in sections:
        rows += [
            ("T30 W1 steps/s while a REPEATABLE READ snapshot is held", f"{median['t30_steps_per_s_held']:.0f}"),
            ("   dead row versions it kept (work items and runs)", f"{median['t30_dead_rows_held']:.0f}"),
            ("T30 W1 steps/s after it ended and a VACUUM", f"{median['t30_steps_per_s_after']:.0f}"),
            ("   dead row versions left after the VACUUM", f"{median['t30_dead_rows_after_vacuum']:.0f}"),
        ]
    if "schedules" in sections:
        n = args.schedules
        rows += [
            (f"W6 {n} schedules every minute: scheduler per minute", f"{median['w6_tick_wall_s']:.2f} s"),
            ("   of which CPU in the scheduling process", f"{median['w6_tick_cpu_s']:.2f} s"),
            ("   queries per minute", f"{median['w6_tick_queries']:.0f}"),
            ("W6 lateness, fire time to run start, p50", f"{median['w6_late_p50_ms']:.0f} ms"),
            ("W6 lateness, fire time to run start, p95", f"{median['w6_late_p95_ms']:.0f} ms"),
        ]
    if sections & {"admin", "api"}:
        rows.append((f"{args.admin_runs} runs and {10 * args.admin_runs} steps: filled in",
                     f"{median['pages_fill_s']:.0f} s"))
    if "admin" in sections:
        for page in ("changelist", "changelist_failed", "changelist_stuck", "changelist_search_id", "overview",
                     "run_detail", "work_items"):
            rows.append((f"admin {page.replace('_', ' ')}: p50 / p95 of 20 loads, queries",
                         f"{median[f'pages_admin_{page}_p50_ms']:.0f} / {median[f'pages_admin_{page}_p95_ms']:.0f} ms, "
                         f"{median[f'pages_admin_{page}_queries']:.0f}"))
    if "api" in sections:
        for route, label in (("status", "GET workflows/{id}/"), ("status_steps", "GET workflows/{id}/?include=steps"),
                             ("bare", "bare Django view, same row")):
            rows.append((f"api {label}: p50 / p95, req/s, queries",
                         f"{median[f'pages_api_{route}_p50_ms']:.2f} / {median[f'pages_api_{route}_p95_ms']:.2f} ms, "
                         f"{median[f'pages_api_{route}_per_s']:.0f}/s, {median[f'pages_api_{route}_queries']:.0f}"))
        rows.append(("api status p50 as a multiple of the bare view", f"{median['pages_api_status_vs_bare']:.2f}"))
        rows.append(("api GET workflows/?status=failed: p50 / p95, queries",
                     f"{median['pages_api_list_p50_ms']:.1f} / {median['pages_api_list_p95_ms']:.1f} ms, "
                     f"{median['pages_api_list_queries']:.0f}"))
    rows += [
        ("queries per step", f"{queries['per_step']:g}"),
        ("queries per claim", f"{queries['per_claim']}"),
        ("queries per 10-step workflow", f"{queries['per_10_step_workflow']}"),
        ("explicit transactions per 10-step workflow", f"{queries['explicit_transactions_per_workflow']}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"\nPostgreSQL, {args.processes} worker processes, median of {args.repeat} runs\n")
    print(f"{'figure':<{width}}  value")
    print(f"{'-' * width}  -------")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps({"median": median, "samples": samples, "queries": queries}, indent=2))


if __name__ == "__main__":
    main()
