"""DBOS Transact's side of `make bench-peers`.

    bench/.venvs/dbos/bin/python bench/peers/dbos_driver.py --url URL [--workload w5|w2|w1|w3] --jobs N --processes P

W5: N one-step workflows enqueued one at a time (DBOSClient), then drained by P processes that
launch DBOS and serve the queue until it is empty. W2: one workflow at a time on an idle process.
W1: N ten-step workflows drained by P processes. W3: one workflow that enqueues N one-step
workflows and waits for them all, served by P processes. The queue polls every 50 ms (DBOS's
default is 1 s), so that polling does not bound the drain.
"""

from __future__ import annotations

from importlib.metadata import version

import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

from dbos import DBOS, DBOSClient  # noqa: E402
from common import (  # noqa: E402
    analyze, argument, latency_w2, report, report_w1, report_w5, run_workers, serving, timed_enqueue, wait_until,
)

URL = os.environ.get("DBOS_URL") or argument("url", "")
ENV = {"DBOS_URL": URL}
queue = None


@DBOS.step()
def step(n):
    return n


@DBOS.workflow()
def one_step(n):
    return step(n)


@DBOS.workflow()
def ten_steps(n):
    for i in range(10):
        step(i)
    return n


@DBOS.workflow()
def fanout(n):
    handles = [queue.enqueue(one_step, i) for i in range(n)]
    return len([handle.get_result() for handle in handles])


def _dbos():
    global queue
    DBOS(config={"name": "bench", "system_database_url": URL, "log_level": "WARNING"})
    DBOS.launch()
    queue = DBOS.register_queue("bench", polling_interval_sec=0.05)


def _sql(statement, *params):
    import psycopg

    with psycopg.connect(URL) as connection:
        return connection.execute(statement, params).fetchone()


def _unfinished() -> int:
    return _sql("SELECT count(*) FROM dbos.workflow_status WHERE status IN ('ENQUEUED', 'PENDING')")[0]


def _client():
    _dbos()  # creates the system database's schema
    DBOS.destroy()
    return DBOSClient(system_database_url=URL)


def _drained():
    """Workflows finished, and the first one's start and the last one's end (epoch seconds)."""
    done, start, end = _sql("SELECT count(*) FILTER (WHERE status = 'SUCCESS'), min(started_at_epoch_ms) / 1000.0, "
                            "max(updated_at) / 1000.0 FROM dbos.workflow_status")
    return done, (start, end)


def w5(jobs: int, processes: int) -> None:
    client = _client()
    options = {"queue_name": "bench", "workflow_name": "one_step"}
    enqueued = timed_enqueue(lambda n: client.enqueue(options, n), jobs)
    client.destroy()
    analyze(URL)
    drained = run_workers([[sys.executable, __file__, "worker"]] * processes, env=ENV)
    done, window = _drained()
    report_w5("dbos", version("dbos"), jobs, done, window, enqueued, drained)


def w1(jobs: int, processes: int) -> None:
    client = _client()
    options = {"queue_name": "bench", "workflow_name": "ten_steps"}
    for n in range(jobs):
        client.enqueue(options, n)
    client.destroy()
    analyze(URL)
    drained = run_workers([[sys.executable, __file__, "worker"]] * processes, env=ENV, url=URL)
    done, window = _drained()
    report_w1("dbos", version("dbos"), jobs, done, window, drained)


def w2(jobs: int) -> None:
    import psycopg

    client = _client()
    options = {"queue_name": "bench", "workflow_name": "one_step"}
    with psycopg.connect(URL, autocommit=True) as connection, \
            serving([[sys.executable, __file__, "serve"]], env=ENV):
        def finished(workflow_id) -> bool:
            row = connection.execute("SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s",
                                     [workflow_id]).fetchone()
            return row is not None and row[0] in ("SUCCESS", "ERROR")

        def server_seconds():
            return [row[0] / 1000.0 for row in connection.execute(
                "SELECT updated_at - created_at FROM dbos.workflow_status ORDER BY created_at")]

        latency_w2("dbos", version("dbos"), jobs, lambda n: client.enqueue(options, n).workflow_id, finished,
                   server_seconds)
    client.destroy()


def w3(items: int, processes: int) -> None:
    client = _client()
    with serving([[sys.executable, __file__, "serve"]] * processes, env=ENV):
        time.sleep(2.0)  # launched and polling, as bench/run.py gives django-durable's worker
        parent = client.enqueue({"queue_name": "bench", "workflow_name": "fanout"}, items).workflow_id
        wait_until(lambda: _sql("SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s",
                                parent)[0] in ("SUCCESS", "ERROR"), timeout=600, every=0.01)
    client.destroy()
    status, seconds = _sql("SELECT status, (updated_at - created_at) / 1000.0 FROM dbos.workflow_status "
                           "WHERE workflow_uuid = %s", parent)
    if status != "SUCCESS":
        raise SystemExit(f"dbos: the fan-out ended {status}")
    report({"system": "dbos", "version": version("dbos"), "items": items, "seconds": float(seconds)})


def main() -> None:
    if sys.argv[1:2] == ["worker"]:  # serve the queue until it is empty
        _dbos()
        while _unfinished():
            time.sleep(0.05)
        DBOS.destroy()
        return
    if sys.argv[1:2] == ["serve"]:  # serve the queue until stopped
        _dbos()
        while True:
            time.sleep(1)
    workload = argument("workload", "w5")
    jobs, processes = int(argument("jobs", 5000)), int(argument("processes", 2))
    {"w5": lambda: w5(jobs, processes), "w2": lambda: w2(jobs), "w1": lambda: w1(jobs, processes),
     "w3": lambda: w3(jobs, processes)}[workload]()


if __name__ == "__main__":
    main()
