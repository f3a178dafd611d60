"""PGQueuer's side of `make bench-peers` (W5 and W2; it has no workflows for W1 and W3).

    bench/.venvs/pgqueuer/bin/python bench/peers/pgqueuer_driver.py --url URL [--workload w5|w2] --jobs N --processes P

PGQueuer is asyncio and claims and finishes jobs in batches (its completions are buffered and
written together), with the psycopg driver (or, --driver asyncpg, asyncpg's). W5: N one-step jobs enqueued one at a time (each
its own commit), then drained by P `pgq run --mode drain` processes with its default batch size
(10). W2: one job at a time on an idle `pgq run` (it listens for new jobs). Times are its log
table's, written by PostgreSQL's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(__file__))

from common import (  # noqa: E402
    analyze, argument, latency_w2, report_w5, run_workers, serving, steady, timed_enqueue, wait_until,
)

URL = (os.environ.get("PGQUEUER_URL") or argument("url", "")).replace("postgres://", "postgresql://", 1)
# The driver its workers use: psycopg (the default here), or asyncpg (--driver asyncpg; its
# documentation's examples use it). Enqueueing is psycopg's in both.
DRIVER = os.environ.get("PGQUEUER_DRIVER") or argument("driver", "psycopg")
ENV = {"PGQUEUER_URL": URL, "PGQUEUER_DRIVER": DRIVER, "PYTHONPATH": os.path.dirname(__file__)}
NAME = "pgqueuer" if DRIVER == "psycopg" else f"pgqueuer-{DRIVER}"
# What `pgq run pgqueuer_driver:factory` does, less its log set-up (which fails with the typer that
# pip installs beside it: "'str' object has no attribute 'name'").
CLI = [sys.executable, __file__, "worker"]


@contextlib.asynccontextmanager
async def factory():
    """The consumer `pgq run` starts: one entrypoint that returns at once."""
    from pgqueuer import PgQueuer

    if DRIVER == "asyncpg":
        import asyncpg
        from pgqueuer.db import AsyncpgDriver

        connection = await asyncpg.connect(URL)
        pgq = PgQueuer(AsyncpgDriver(connection))
    else:
        import psycopg
        from pgqueuer.db import PsycopgDriver

        connection = await psycopg.AsyncConnection.connect(URL, autocommit=True)
        pgq = PgQueuer(PsycopgDriver(connection))

    @pgq.entrypoint("one_step")
    async def one_step(job) -> None:
        return None

    try:
        yield pgq
    finally:
        await connection.close()


def _install() -> None:
    import psycopg
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.queries import Queries

    async def install():
        async with await psycopg.AsyncConnection.connect(URL, autocommit=True) as connection:
            installed = await (await connection.execute("SELECT to_regclass('pgqueuer') IS NOT NULL")).fetchone()
            if not installed[0]:
                await Queries(PsycopgDriver(connection)).install()

    asyncio.run(install())


def _enqueuer(connection):
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    queries = SyncQueries(SyncPsycopgDriver(connection))
    return lambda n: queries.enqueue("one_step", str(n).encode())[0]


def w5(jobs: int, processes: int) -> None:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as connection:
        enqueued = timed_enqueue(_enqueuer(connection), jobs)
    analyze(URL)
    drained = run_workers([[*CLI, "--drain"]] * processes, env=ENV, url=URL)
    with psycopg.connect(URL) as connection:
        (done,) = connection.execute("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'").fetchone()
        window = connection.execute(
            "SELECT EXTRACT(EPOCH FROM min(created) FILTER (WHERE status = 'picked')), "
            "EXTRACT(EPOCH FROM max(created) FILTER (WHERE status = 'successful')) FROM pgqueuer_log").fetchone()
    report_w5(NAME, version("pgqueuer"), jobs, done, window, enqueued, drained)


def w2(jobs: int) -> None:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as connection, serving([CLI], env=ENV):
        enqueue = _enqueuer(connection)

        def finished(job_id) -> bool:
            row = connection.execute("SELECT 1 FROM pgqueuer_log WHERE job_id = %s AND status IN "
                                     "('successful', 'exception')", [job_id]).fetchone()
            return row is not None

        def server_seconds():
            return [row[0] for row in connection.execute(
                "SELECT EXTRACT(EPOCH FROM max(created) FILTER (WHERE status = 'successful') "
                "- min(created) FILTER (WHERE status = 'queued')) FROM pgqueuer_log GROUP BY job_id ORDER BY job_id")]

        latency_w2(NAME, version("pgqueuer"), jobs, enqueue, finished, server_seconds)


def steady_load(rate: float, seconds: float, processes: int, hold_at: float, hold_for: float) -> None:
    """A steady load of one-step jobs (make bench-horizon) on `processes` continuous `pgq run`s."""
    import psycopg
    from pgqueuer.db import SyncPsycopgDriver
    from pgqueuer.queries import SyncQueries

    with psycopg.connect(URL, autocommit=True) as connection:
        connection.execute("TRUNCATE pgqueuer, pgqueuer_log")

        def jobs() -> list:
            return connection.execute(
                "SELECT EXTRACT(EPOCH FROM min(created) FILTER (WHERE status = 'queued')), "
                "EXTRACT(EPOCH FROM min(created) FILTER (WHERE status = 'picked')), "
                "EXTRACT(EPOCH FROM min(created) FILTER (WHERE status = 'successful')) "
                "FROM pgqueuer_log GROUP BY job_id").fetchall()

        with serving([CLI] * processes, env=ENV):
            enqueue = _enqueuer(connection)
            for n in range(20):  # the workers up before the clock starts
                enqueue(n)
            wait_until(lambda: sum(1 for *_, finished in jobs() if finished is not None) == 20, timeout=120,
                       every=0.1)
            connection.execute("TRUNCATE pgqueuer, pgqueuer_log")
            queries = SyncQueries(SyncPsycopgDriver(connection))

            def enqueue_many(numbers) -> None:  # one statement, one commit
                numbers = list(numbers)
                queries.enqueue(["one_step"] * len(numbers), [str(n).encode() for n in numbers], [0] * len(numbers))

            steady(NAME, version("pgqueuer"), URL, enqueue_many, rate, seconds, hold_at, hold_for,
                   ["pgqueuer", "pgqueuer_log"], jobs)


def worker(drain: bool) -> None:
    """`pgq run` with its defaults (batch size 10); --drain: `--mode drain`, exit once the queue is empty."""
    from datetime import timedelta

    from pgqueuer import types
    from pgqueuer.adapters.cli import supervisor

    mode = types.QueueExecutionMode.drain if drain else types.QueueExecutionMode.continuous
    asyncio.run(supervisor.run(factory, mode=mode, dequeue_timeout=timedelta(seconds=0.1 if drain else 30)))


def enqueue_blocks() -> None:
    """For bench/start.py --against-pgqueuer: for each line N read, N jobs enqueued one a commit as
    W5 enqueues them; then a line of JSON: each enqueue's wall time (s) and the block's CPU (s)."""
    import json
    import time

    import psycopg

    _install()
    with psycopg.connect(URL, autocommit=True) as connection:
        enqueue = _enqueuer(connection)
        print("ready", flush=True)
        for line in sys.stdin:
            walls, cpu = [], time.process_time()
            for n in range(int(line)):
                began = time.perf_counter()
                enqueue(n)
                walls.append(time.perf_counter() - began)
            print(json.dumps({"walls": walls, "cpu_s": time.process_time() - cpu}), flush=True)
        connection.execute("TRUNCATE pgqueuer, pgqueuer_log")


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        worker("--drain" in sys.argv)
        return
    if sys.argv[1:2] == ["enqueue-blocks"]:
        enqueue_blocks()
        return
    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    _install()
    if workload == "steady":
        steady_load(float(argument("rate", 500)), float(argument("seconds", 600)), processes,
                    float(argument("hold-at", 120)), float(argument("hold-for", 300)))
        return
    {"w5": lambda: w5(jobs, processes), "w2": lambda: w2(jobs)}[workload]()


if __name__ == "__main__":
    main()
