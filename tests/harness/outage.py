"""A database outage is not a lost worker: PostgreSQL goes away for longer than a lease while
every worker is in the middle of a step, and comes back.

    python -m tests.harness.outage     prints what it measured; exit 0 if every check held,
                                       1 if one did not, 2 if it could not run

Two worker processes run runs of six half-second steps. The server is stopped as a crash stops it
(`pg_ctl stop -m immediate`), stays down for OUTAGE seconds (more than twice the lease), and starts
again. With DURABLE_MAX_DELIVERIES=1, a run whose claim a reaper took back as a lost worker's
would fail at once, so every run completing shows that no delivery was spent on the outage.

Checks:
- every run completes with its result;
- no claim was taken back as a lost worker's ("delivery ... after worker ... was lost"), and no
  worker said it lost a claim;
- each thread of each worker says the outage (a warning for each kind of error: at most three)
  and its end once, and backs off
  between tries: at most MAX_TRIES warnings or debug lines of failed tries per process (a try every
  tick would be about 4 a second);
- every worker listens for notifications again within LISTEN_BACK seconds of the server answering
  (measured in pg_stat_activity; the poll interval is POLL seconds, so a worker left polling shows);
- an idle worker is woken by a start's NOTIFY: a run started after the outage, with every worker
  idle, completes in less than half the poll interval.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests import harness
from tests.harness import stop, verdict
from tests.harness.chaos import ROOT, Postgres, SoakError, environment, retrying, setup_django

WORKERS = 2
RUNS = 6
LEASE = 3.0
OUTAGE = 8.0  # seconds the server is down: more than twice the lease
POLL = 30.0  # the idle workers' poll interval: a worker that stopped listening waits this long
LISTEN_BACK = POLL / 2
MAX_TRIES = 20  # failed tries logged per process over the outage (its two threads, backing off)


def wait_for(condition, seconds: float, what: str):
    """harness.wait_for, each look retried while the server is away."""
    return harness.wait_for(lambda: retrying(condition), seconds, what)


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="durable-outage-"))
    workdir.chmod(0o755)
    server = Postgres(workdir / "pg")
    workers: list[subprocess.Popen] = []
    logs = [workdir / f"worker{n}.log" for n in range(WORKERS)]
    try:
        server.start()
        env = dict(environment(server, workdir), DURABLE_LEASE_SECONDS=str(LEASE), DURABLE_MAX_DELIVERIES="1",
                   DURABLE_POLL_INTERVAL=str(POLL), DURABLE_LOG_LEVEL="DEBUG")
        setup_django(env)
        import django_durable as durable
        from django.db import connections
        from django_durable.models import Step, WorkflowRun

        for log in logs:
            with open(log, "w") as out:
                workers.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", "1"], cwd=ROOT, env=env,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        wait_for(lambda: harness.listeners() == WORKERS, 60, "every worker listening")
        runs = [durable.start("tests.naps", n=6, seconds=0.5).pk for _ in range(RUNS)]
        # Every worker in the middle of a run: a step of each of two runs recorded.
        wait_for(lambda: Step.objects.filter(status="completed").values("run").distinct().count() >= WORKERS, 60,
                 "two runs under way")
        connections.close_all()
        stopped = time.monotonic()
        up = server.down(OUTAGE)
        print(f"outage: the server stopped as by a crash for {up - stopped:.1f} s "
              f"(lease {LEASE:g} s, DURABLE_MAX_DELIVERIES=1), {WORKERS} workers in the middle of steps")
        wait_for(lambda: harness.listeners() == WORKERS, 90, "every worker listening again")
        listen_back = time.monotonic() - up
        print(f"outage: every worker listening again {listen_back:.1f} s after the server answered "
              f"(bound {LISTEN_BACK:g} s; poll interval {POLL:g} s)")
        wait_for(lambda: WorkflowRun.objects.filter(id__in=runs).exclude(status__in=["pending", "running"]).count()
                 == RUNS, 120, "every run ended")
        ended = retrying(lambda: list(WorkflowRun.objects.filter(id__in=runs).values_list("status", "error")))
        completed = [status for status, _ in ended].count("completed")
        print(f"outage: {completed} of {RUNS} runs completed")
        # Every worker idle now: a start's notification wakes one at once, not a poll later.
        wait_for(lambda: not Step.objects.filter(status="running").exists(), 30, "every worker idle")
        time.sleep(1.0)
        started = time.monotonic()
        woken = durable.start("tests.three_steps", x=1).pk
        wait_for(lambda: WorkflowRun.objects.get(id=woken).status == "completed", POLL * 2, "the run started last")
        woken_in = time.monotonic() - started
        print(f"outage: a run started with every worker idle completed in {woken_in:.2f} s (bound {POLL / 2:g} s)")

        text = [log.read_text(errors="replace") for log in logs]
        lost = [line for t in text for line in t.splitlines() if "was lost" in line or "lost its claim" in line]
        tries = [len(re.findall(r"Database error in (?:worker|maintenance)", t)) for t in text]
        said = [len(re.findall(r"Database error in maintenance of \S+: .*trying again with back-off", t)) for t in text]
        ends = [len(re.findall(r"The database answers maintenance", t)) for t in text]
        print(f"outage: failed tries logged per process {tries} (bound {MAX_TRIES}); the maintenance thread's "
              f"warnings {said}, its ends {ends}; claims taken back as lost workers': {len(lost)}")
        failures = []
        if completed != RUNS:
            failures.append(f"runs not completed: {[e for e in ended if e[0] != 'completed']}")
        if lost:
            failures.append(f"claims lost to the outage: {lost[:5]}")
        if max(tries) > MAX_TRIES or not all(1 <= n <= 3 for n in said) or ends != [1] * WORKERS:
            failures.append("the maintenance thread did not back off, or did not say the outage once")
        if listen_back > LISTEN_BACK:
            failures.append("a worker was left polling after the outage")
        if woken_in > POLL / 2:
            failures.append("an idle worker was not woken by the start's notification")
        return verdict(failures)
    except SoakError as exc:
        print(f"outage: could not run: {exc}", file=sys.stderr)
        return 2
    finally:
        stop(workers, logs, show="-v" in sys.argv)
        server.stop()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    sys.exit(main())
