"""Through a transaction pooler (RELIABILITY T43): PgBouncer in transaction mode between every
process and PostgreSQL, the listening sessions straight to the server (DURABLE_LISTEN_DATABASE).

    python -m tests.harness.pooler     prints what it checked; exit 0 if every check held, 1 if
                                       one did not, 2 if it could not run

Its own PostgreSQL (scripts/pg-server.sh) and PgBouncer (scripts/pgbouncer.sh); two worker
processes with the default settings (prepared statements on: a worker finds out that the pooler
loses them and goes on unprepared). Checks, each through the pooler:
- every worker listens on the server directly (pg_stat_activity), and one run at a time on idle
  workers (W2) takes less from start() to wait()'s answer than wait()'s first pause: the start
  woke a worker and the end woke wait(), each heard on a session that goes around the pooler;
- a run waiting for two signals takes them and ends with both;
- an atomic step writes its ORM row once;
- a cancel interrupts a running step after its grace, and the step after it never runs;
- no worker logs an error, and each says at most once that it goes on unprepared.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.harness import listeners, stop, verdict, wait_for
from tests.harness.chaos import ROOT, Postgres, SoakError, environment, setup_django

WORKERS = 2
POLL = 1.0  # the default poll interval: a worker that did not hear the start claims a poll later
W2_RUNS = 50


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="durable-pooler-"))
    workdir.chmod(0o755)
    server = Postgres(workdir / "pg")
    workers: list[subprocess.Popen] = []
    logs = [workdir / f"worker{n}.log" for n in range(WORKERS)]
    failures: list[str] = []
    try:
        server.start()
        server.start_pooler()
        env = dict(environment(server, workdir), DURABLE_POLL_INTERVAL=str(POLL), DURABLE_CANCEL_GRACE_SECONDS="1")
        setup_django(env)
        import django_durable as durable
        from django_durable.services.runs import LISTENING_FIRST_PAUSE
        from tests.testapp import ledger
        from tests.testapp.models import Payment

        print(f"pooler: PgBouncer {subprocess.run(['pgbouncer', '--version'], capture_output=True, text=True).stdout.split()[1]}"
              f" in transaction mode at {server.pooler_url}; listening straight to {server.url}")
        for log in logs:
            with open(log, "w") as out:
                workers.append(subprocess.Popen(
                    [sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", "1"], cwd=ROOT, env=env,
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))

        wait_for(lambda: listeners("direct") == WORKERS, 60, "every worker listening on the server directly")
        print(f"pooler: {WORKERS} workers listening on the server directly")

        # W2: one run at a time on idle workers, start() to wait()'s answer.
        latencies = []
        for _ in range(W2_RUNS):
            began = time.perf_counter()
            durable.start_and_wait("tests.three_steps", x=1, timeout=30)
            latencies.append(time.perf_counter() - began)
        w2 = statistics.median(latencies)
        print(f"pooler: W2, {W2_RUNS} three-step runs one at a time: p50 {1000 * w2:.1f} ms "
              f"(bound {1000 * LISTENING_FIRST_PAUSE:.0f} ms: a worker or a wait() that did not hear its "
              f"notification would look a poll or a pause later)")
        if w2 > LISTENING_FIRST_PAUSE:
            failures.append("W2 waited on polling: a notification (the start's, or the end's to wait()) was not heard")

        run = durable.start("tests.two_signals")
        durable.signal(run.pk, "go", 1)
        durable.signal(run.pk, "go", 2)
        got = durable.wait(run.pk, timeout=60)
        print(f"pooler: a run waiting for two signals ended with {got}")
        if got != [1, 2]:
            failures.append(f"the signals' run ended with {got!r}")

        run = durable.start("tests.atomic_pay", amount=7)
        durable.wait(run.pk, timeout=60)
        rows = Payment.objects.filter(run_id=run.pk).count()
        print(f"pooler: an atomic step wrote {rows} row")
        if rows != 1:
            failures.append(f"the atomic step wrote {rows} rows")

        reached = workdir / "reached"
        run = durable.start("tests.long_step", reached=str(reached), seconds=30)
        wait_for(reached.exists, 60, "the long step to start")
        asked = time.monotonic()
        durable.cancel(run.pk, "through the pooler")
        try:
            durable.wait(run.pk, timeout=30)
        except durable.WorkflowFailed:
            pass
        run.refresh_from_db()
        took = time.monotonic() - asked
        print(f"pooler: a running step cancelled: the run {run.status} {took:.1f} s after the cancel (grace 1 s); "
              f"the step after it ran {ledger.count(run.pk, 'never')} times")
        if run.status != "cancelled" or ledger.count(run.pk, "never") or took > 20:
            failures.append("the cancel of a running step")

        text = [log.read_text(errors="replace") for log in logs]
        errors = [line for t in text for line in t.splitlines() if re.search(r"\bERROR\b|Traceback", line)]
        unprepared = [t.count("sending statements unprepared") for t in text]
        print(f"pooler: worker log lines of errors {len(errors)}; 'going on unprepared' said per worker {unprepared}")
        if errors:
            failures.append(f"worker errors: {errors[:3]}")
        if max(unprepared) > 1:
            failures.append("a worker said more than once that it goes on unprepared")
        return verdict(failures)
    except SoakError as exc:
        print(f"pooler: could not run: {exc}", file=sys.stderr)
        return 2
    finally:
        stop(workers, logs, show="-v" in sys.argv)
        server.stop()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    sys.exit(main())
