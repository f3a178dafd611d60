"""A 100 MB step result stored apart (issue 16): the worker's peak memory, and the claim latency of
other runs meanwhile.

    DATABASE_URL=postgres://... python bench/payloads.py --mb 100

Three burst workers, each in a fresh process, run one workflow whose step builds about `--mb` MB of
JSON (a list of distinct 100-character strings):
  value only   the step returns the list's length: the memory of the value itself
  stored       the step returns the list, DURABLE_PAYLOAD_OFFLOAD_BYTES = 1 MB: streamed to the storage
  inline       the step returns the list, no offloading (DURABLE_MAX_PAYLOAD_BYTES raised to fit)
  read back    stored by one worker, then the run sleeps; a second worker (measured) replays the
               step, which reads the value back from the storage
Each worker's peak resident memory (ru_maxrss) is printed, and its growth over "value only".
Meanwhile, in the stored round, an idle second worker takes one-step runs started one at a time:
their start-to-result latency is compared with the same runs when nothing big is being written.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402

import django_durable as durable  # noqa: E402
from bench.run import worker_command, worker_env  # noqa: E402
from django_durable.models import Step, WorkflowRun  # noqa: E402


def peak_mb(mb: int, keep: bool, env: dict, reread: bool = False) -> tuple[float, float]:
    """(the burst worker's peak RSS in MB, seconds) for one big_result run."""
    run = durable.start("bench.big_result", mb=mb, keep=keep, reread=reread)
    connections.close_all()
    # A wrapper process of its own, so that its children's peak is this worker's alone.
    measure = "import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); " \
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    command = [sys.executable, "-c", measure, *worker_command("--burst", "-c", "1", "-v", "0")]
    if reread:  # the first worker stores it; once the sleep is over, a second one reads it back
        subprocess.run(command, env=worker_env(**env), check=True, cwd=ROOT, capture_output=True)
        time.sleep(1.0)
        connections.close_all()
    started = time.perf_counter()
    done = subprocess.run(command, env=worker_env(**env), check=True, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    after = int(done.stdout.split()[-1])
    run.refresh_from_db()
    assert run.status == "completed", run.error
    return after / 1024, seconds


def latencies(runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run = durable.start("bench.one_step", queue="small")
        durable.wait(run.pk, timeout=120)
        times.append(1000 * (time.perf_counter() - started))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--small-runs", type=int, default=50)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    store = tempfile.mkdtemp(prefix="durable-payloads-")
    stored_env = {"DURABLE_BENCH_OFFLOAD_BYTES": str(1 << 20), "DURABLE_BENCH_STORAGE": store}
    inline_env = {"DURABLE_BENCH_MAX_PAYLOAD_BYTES": str(4 * args.mb << 20)}
    value_only, _ = peak_mb(args.mb, False, {})
    stored, stored_s = peak_mb(args.mb, True, stored_env)
    inline, inline_s = peak_mb(args.mb, True, inline_env)
    reread, reread_s = peak_mb(args.mb, True, stored_env, reread=True)
    size = max(f.stat().st_size for f in Path(store).rglob("*.json")) / 1e6
    print(f"JSON of the result: {size:.0f} MB")
    print(f"{'':14}{'peak RSS MB':>12}{'over value':>12}{'seconds':>9}")
    print(f"{'value only':14}{value_only:12.0f}{0:12.0f}")
    print(f"{'stored':14}{stored:12.0f}{stored - value_only:12.0f}{stored_s:9.1f}")
    print(f"{'inline':14}{inline:12.0f}{inline - value_only:12.0f}{inline_s:9.1f}")
    print(f"{'read back':14}{reread:12.0f}{reread - value_only:12.0f}{reread_s:9.1f}"
          "   (stored, then a replay reads it back)")

    # Claim latency of small runs on another worker, while a big result is being stored.
    small = subprocess.Popen(worker_command("-c", "1", "-v", "0", "--queues", "small"), env=worker_env(), cwd=ROOT)
    try:
        time.sleep(2)
        quiet = latencies(args.small_runs)
        durable.start("bench.big_result", mb=args.mb, keep=True)
        connections.close_all()
        big = subprocess.Popen(worker_command("--burst", "-c", "1", "-v", "0", "--queues", "default"),
                               env=worker_env(**stored_env), cwd=ROOT)
        time.sleep(1)
        busy = latencies(args.small_runs)
        big.wait(timeout=600)
    finally:
        small.terminate()
        small.wait(timeout=30)
    print(f"one-step runs on another worker, p50: {statistics.median(quiet):.1f} ms quiet, "
          f"{statistics.median(busy):.1f} ms while {args.mb} MB were stored (ratio {statistics.median(busy) / statistics.median(quiet):.2f})")
    WorkflowRun.objects.filter(workflow__in=["bench.big_result", "bench.one_step"]).delete()
    assert not Step.objects.filter(run__workflow="bench.big_result").exists()


if __name__ == "__main__":
    main()
