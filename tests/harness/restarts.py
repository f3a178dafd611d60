"""RELIABILITY T07: PostgreSQL crash-restarts in the middle of a sweep of 200 expired claims, and
none is stranded: the sweep's transaction is lost, the next one completes, every run finishes.

    python -m tests.harness.restarts     exit 0 if every run finished, 1 if not, 2 if it could not run

It starts a PostgreSQL server of its own (as tests/harness/chaos.py does).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.harness.chaos import ROOT, Postgres, SoakError, environment, retrying, setup_django

RUNS = 200


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="durable-restarts-"))
    workdir.chmod(0o755)
    server = Postgres(workdir / "pg")
    worker = None
    try:
        server.start()
        env = environment(server, workdir)
        setup_django(env)
        import django_durable as durable
        from django_durable import workpool
        from django_durable.models import WorkflowRun, WorkItem

        runs = [durable.start("tests.three_steps", x=i) for i in range(RUNS)]
        while workpool.claim(worker="dead", queues=None, db="default") is not None:
            pass  # a worker that died holding every one of them...
        WorkItem.objects.update(claim_expires_at="2000-01-01T00:00:00Z")  # ...long ago
        sweeping = workdir / "sweeping"
        # The first sweep that finds rows says so and dawdles with them locked.
        faults = f"sweeper_after_select=once:{workdir / 'swept'}+touch:{sweeping}+sleep:0.6"
        with open(workdir / "worker.log", "w") as log:
            worker = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", "1"],
                                      cwd=ROOT, env=dict(env, DURABLE_FAULTS=faults), stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not sweeping.exists():
            if time.monotonic() > deadline:
                raise SoakError("the worker never swept")
            time.sleep(0.02)
        time.sleep(0.2)
        server.restart()  # 0.2 s into the sweep
        deadline = time.monotonic() + 180
        while retrying(lambda: WorkflowRun.objects.filter(status="completed").count()) < RUNS:
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        done = retrying(lambda: WorkflowRun.objects.filter(status="completed").count())
        stranded = retrying(lambda: WorkItem.objects.exclude(status="completed").count())
        from django_durable import serialization

        results = sorted(serialization.decode(r) for r in retrying(
            lambda: list(WorkflowRun.objects.values_list("result", flat=True))))
        log = (workdir / "worker.log").read_text(errors="replace")
        print(f"T07: {RUNS} expired claims, PostgreSQL restarted 0.2 s into the sweep: {done} runs completed, "
              f"{stranded} work items left, sweep error logged: {'Database error in maintenance' in log}")
        ok = done == RUNS and stranded == 0 and results == [[i, i + 1, i + 2] for i in range(RUNS)]
        del runs
        return 0 if ok else 1
    except SoakError as exc:
        print(f"T07: could not run: {exc}", file=sys.stderr)
        return 2
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
        server.stop()
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


if __name__ == "__main__":
    sys.exit(main())
