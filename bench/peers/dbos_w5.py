"""W5 on DBOS Transact: enqueue N one-step workflows one at a time (DBOSClient), then drain them
with P processes that launch DBOS and serve the queue until it is empty.

    bench/.venvs/dbos/bin/python bench/peers/dbos_w5.py --url URL --jobs N --processes P

The queue polls every 50 ms (DBOS's default is 1 s), so that polling does not bound the drain.
"""

from __future__ import annotations

from importlib.metadata import version

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from dbos import DBOS, DBOSClient  # noqa: E402
from common import analyze, argument, report_w5, run_workers, timed_enqueue  # noqa: E402

URL = os.environ.get("DBOS_URL") or argument("url", "")


@DBOS.step()
def step(n):
    return n


@DBOS.workflow()
def one_step(n):
    return step(n)


def _dbos():
    DBOS(config={"name": "bench", "system_database_url": URL, "log_level": "WARNING"})
    DBOS.launch()
    DBOS.register_queue("bench", polling_interval_sec=0.05)


def _unfinished() -> int:
    import psycopg

    with psycopg.connect(URL) as connection:
        return connection.execute("SELECT count(*) FROM dbos.workflow_status "
                                  "WHERE status IN ('ENQUEUED', 'PENDING')").fetchone()[0]


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        _dbos()
        while _unfinished():
            time.sleep(0.05)
        DBOS.destroy()
        return
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    _dbos()  # creates the system database's schema
    DBOS.destroy()
    client = DBOSClient(system_database_url=URL)
    options = {"queue_name": "bench", "workflow_name": "one_step"}
    enqueue_per_s = timed_enqueue(lambda n: client.enqueue(options, n), jobs)
    client.destroy()
    analyze(URL)
    drained = run_workers([[sys.executable, __file__, "worker"]] * processes, env={"DBOS_URL": URL})
    import psycopg

    with psycopg.connect(URL) as connection:
        done, seconds = connection.execute(
            "SELECT count(*) FILTER (WHERE status = 'SUCCESS'), (max(updated_at) - min(started_at_epoch_ms)) / 1000.0 "
            "FROM dbos.workflow_status").fetchone()
    report_w5("dbos", version("dbos"), jobs, done, seconds, enqueue_per_s, drained)


if __name__ == "__main__":
    main()
