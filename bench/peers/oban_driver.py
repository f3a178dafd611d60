"""Oban for Python's side of `make bench-peers` (W5 and W2; workflows are Oban Pro's, not measured).

    bench/.venvs/oban/bin/python bench/peers/oban_driver.py --url URL [--workload w5|w2] --jobs N --processes P

Oban (the `oban` package: asyncio, psycopg's pool, Python 3.12+) with its schema installed as its
documentation says (`oban.schema.install`). W5: N jobs of a worker whose `process` returns at once,
enqueued one at a time through an Oban client (each its own commit), then drained by P processes,
each an `Oban` with the queue at a limit of LIMIT jobs at once, on uvloop as `oban start` runs
it (`oban start --queues default:10` but for the drain); Oban has no drain mode, so each
process stops its instance once no job is available or executing. W2: one job at a time on an
idle instance (its notifier hears each insert). Times are the jobs' own columns, written by
PostgreSQL's clock.
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(__file__))

from common import Enqueued, analyze, argument, latency_w2, report_w5, run_workers, serving  # noqa: E402

URL = (os.environ.get("OBAN_BENCH_URL") or argument("url", "")).replace("postgres://", "postgresql://", 1)
ENV = {"OBAN_BENCH_URL": URL}
CLI = [sys.executable, __file__, "worker"]
LIMIT = 10  # jobs at once per process, as PGQueuer's batch of 10


def _worker_class():
    from oban import worker

    @worker(queue="default")
    class OneStep:
        async def process(self, job):
            return None

    return OneStep


async def _pool(size: int = 1):
    from psycopg_pool import AsyncConnectionPool

    pool = AsyncConnectionPool(conninfo=URL, min_size=1, max_size=size, open=False)
    await pool.open()
    return pool


async def _install() -> None:
    from oban.schema import install

    pool = await _pool()
    try:
        async with pool.connection() as connection:
            installed = await (await connection.execute("SELECT to_regclass('oban_jobs') IS NOT NULL")).fetchone()
        if not installed[0]:
            await install(pool)
    finally:
        await pool.close()


async def _enqueue_all(jobs: int, first: int = 0) -> Enqueued:
    """Enqueue `jobs` jobs one at a time through a client (no queues); how many per second, and the CPU."""
    from oban import Oban

    one_step = _worker_class()
    pool = await _pool()
    try:
        async with Oban(pool=pool):
            began = Enqueued.clocks()
            for n in range(first, first + jobs):
                await one_step.enqueue({"n": n})
            return Enqueued.since(began, jobs)
    finally:
        await pool.close()


def w5(jobs: int, processes: int) -> None:
    import psycopg

    enqueued = asyncio.run(_enqueue_all(jobs))
    analyze(URL)
    drained = run_workers([[*CLI, "--drain"]] * processes, env=ENV, url=URL)
    with psycopg.connect(URL) as connection:
        done, *window = connection.execute(
            "SELECT count(*) FILTER (WHERE state = 'completed'), EXTRACT(EPOCH FROM min(attempted_at)), "
            "EXTRACT(EPOCH FROM max(completed_at)) FROM oban_jobs").fetchone()
    report_w5("oban", version("oban"), jobs, done, window, enqueued, drained)


def w2(jobs: int) -> None:
    import psycopg

    with psycopg.connect(URL, autocommit=True) as connection, serving([CLI], env=ENV):
        loop = asyncio.new_event_loop()
        from oban import Oban

        one_step = _worker_class()
        pool = loop.run_until_complete(_pool())
        client = Oban(pool=pool)

        def enqueue(n):
            return loop.run_until_complete(one_step.enqueue({"n": n})).id

        def finished(job_id) -> bool:
            row = connection.execute("SELECT state FROM oban_jobs WHERE id = %s", [job_id]).fetchone()
            return row is not None and row[0] in ("completed", "discarded", "cancelled")

        def server_seconds():
            return [row[0] for row in connection.execute(
                "SELECT EXTRACT(EPOCH FROM completed_at - inserted_at) FROM oban_jobs ORDER BY id")]

        try:
            loop.run_until_complete(client.start())
            latency_w2("oban", version("oban"), jobs, enqueue, finished, server_seconds)
        finally:
            loop.run_until_complete(client.stop())
            loop.run_until_complete(pool.close())
            loop.close()


async def _serve(drain: bool) -> None:
    """An Oban instance working the queue; with `drain`, stopped once no job is left to run."""
    import signal

    from oban import Oban

    _worker_class()
    pool = await _pool(LIMIT + 2)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        async with Oban(pool=pool, queues={"default": LIMIT}):
            if not drain:
                await stop.wait()
                return
            async with pool.connection() as connection:
                while True:
                    await asyncio.sleep(0.05)
                    left = await (await connection.execute(
                        "SELECT count(*) FROM oban_jobs WHERE state IN ('available', 'executing')")).fetchone()
                    if left[0] == 0:
                        return
    finally:
        await pool.close()


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        try:  # as `oban start` runs: on uvloop when it is installed (it is one of Oban's dependencies)
            from uvloop import run
        except ImportError:
            run = asyncio.run
        run(_serve("--drain" in sys.argv))
        return
    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    asyncio.run(_install())
    {"w5": lambda: w5(jobs, processes), "w2": lambda: w2(jobs)}[workload]()


if __name__ == "__main__":
    main()
