"""The tasks soak: `django.tasks` tasks on DurableBackend, produced at a steady rate with bursts,
on worker supervisors whose processes are SIGKILLed; then every task is checked (`make soak-tasks`).

    python -m tests.harness.tasks_soak [--duration 300] [--baseline 60] [--rate 30] [--kills 18] [--seed N]

The shape of the soak django-ox publishes for its own backend: a quiet baseline, then as long
again (or longer) with SIGKILLs of worker processes at random moments, tasks produced all along
(one in five slow, 50-150 ms; the others quick, and every 20 s a burst of quick ones, so that the
kills also meet claims taken in batches). Then it drains, stops the workers and checks:

- every task enqueued ended SUCCESSFUL, and nothing is left claimed or queued;
- every task ran at least once, and a task that ran twice had a run in a killed process;
- every task taken back (a "worker lost" entry in its trail) was a killed process's, taken back
  within the lease of the kill (the supervisor does it at once; the reaper would a lease and a
  reaper interval later);
- and it reports tasks/s, the kills, the reclaim times (slowest against the lease) and the latency
  from enqueue to finished, p50 and p95, quiet and under chaos.

It starts a PostgreSQL server of its own (tests/harness/chaos.py's), prints one table and exits 1
if any check failed (2 if the soak could not run). `--break MODE,...` damages it on purpose, from
outside the engine, to show that the checks catch it:

    unrecorded-kill  SIGKILL a busy worker process without noting it (its tasks run twice, unexplained)
    lost-task        delete a task's run once it finished (a task enqueued that never ended)
    stale-claim      give a finished task a claimed work item again (something left claimed)
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.harness import stop
from tests.harness.chaos import (LEASE, Postgres, SoakError, environment, on_own_server, retrying, setup_django,
                                  worker_processes)

ROOT = Path(__file__).resolve().parents[2]
SUPERVISORS, PROCESSES = 2, 2
BREAKS = {
    "unrecorded-kill": "a task run twice had a run in a killed process",
    "lost-task": "every task ended SUCCESSFUL",
    "stale-claim": "nothing left claimed or queued",
}
CHECKS = [
    "every task ended SUCCESSFUL",
    "every task ran at least once",
    "a task run twice had a run in a killed process",
    "a killed process's tasks were claimed again within the lease",
    "nothing left claimed or queued",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=300, help="seconds of chaos after the baseline")
    parser.add_argument("--baseline", type=float, default=60, help="quiet seconds first")
    parser.add_argument("--rate", type=float, default=30, help="tasks enqueued per second, besides the bursts")
    parser.add_argument("--kills", type=int, default=18, help="SIGKILLs of worker processes during the chaos")
    parser.add_argument("--burst", type=int, default=300, help="quick tasks enqueued at once every 20 s")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--break", dest="breaks", default="", help=f"damage on purpose: {', '.join(BREAKS)}")
    options = parser.parse_args(argv)
    options.breaks = [b for b in options.breaks.split(",") if b]
    if unknown := sorted(set(options.breaks) - set(BREAKS)):
        parser.error(f"unknown --break {unknown[0]!r}; choose from {', '.join(BREAKS)}")
    seed = options.seed if options.seed is not None else random.randrange(1_000_000)
    return on_own_server("tasks-soak", lambda workdir, server: TasksSoak(options, seed, workdir, server))


class TasksSoak:
    def __init__(self, options, seed: int, workdir: Path, server: Postgres):
        self.options, self.seed, self.workdir, self.server = options, seed, workdir, server
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.enqueued: list[tuple[str, str, float]] = []  # (result id, key, time.time() at enqueue)
        self.kills: list[tuple[float, int, list[str]]] = []  # (time.time(), pid, run ids it held)
        self.supervisors: list[subprocess.Popen] = []
        self.chaos_from = 0.0

    def run(self) -> int:
        env = environment(self.server, self.workdir)
        setup_django(env)
        for group in range(SUPERVISORS):
            log = open(self.workdir / f"supervisor-{group}.log", "w")
            self.supervisors.append(subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", str(PROCESSES)],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
        began = time.time()
        self.chaos_from = began + self.options.baseline
        producer = threading.Thread(target=self.produce, daemon=True)
        producer.start()
        self.chaos(began)
        self.stop.set()
        producer.join(timeout=120)
        ended = time.time()
        drained = self.drain()
        self.damage()
        stop(self.supervisors)
        figures, violations = self.check(began, ended, drained)
        print(self.table(figures, violations))
        return 1 if any(violations.values()) else 0

    # -- the load and the faults -------------------------------------------------------------------

    def produce(self) -> None:
        """`rate` tasks a second (one in five slow), and a burst of quick ones every 20 s."""
        from tests.testapp.tasks import soak_task

        interval, next_burst, n = 1.0 / self.options.rate, time.monotonic() + 5, 0

        def enqueue(millis: int) -> None:
            nonlocal n
            key = f"t{n}"
            n += 1
            result = retrying(lambda: soak_task.enqueue(key, millis))
            self.enqueued.append((result.id, key, time.time()))

        while not self.stop.is_set():
            if time.monotonic() >= next_burst:
                next_burst += 20
                for _ in range(self.options.burst):
                    enqueue(0)
            enqueue(self.rng.randint(50, 150) if self.rng.random() < 0.2 else 1)
            time.sleep(interval)

    def chaos(self, began: float) -> None:
        """Wait out the baseline, then SIGKILL a worker process at each of `kills` random moments."""
        duration = self.options.duration
        moments = sorted(self.rng.uniform(0, duration) for _ in range(self.options.kills))
        for moment in moments:
            self._sleep_until(self.chaos_from + moment)
            self.kill_one()
        self._sleep_until(self.chaos_from + duration)

    def _sleep_until(self, when: float) -> None:
        while time.time() < when:
            if any(s.poll() is not None for s in self.supervisors):
                raise SoakError("a worker supervisor exited during the soak")
            time.sleep(min(0.2, max(0.0, when - time.time())))

    def kill_one(self) -> None:
        from django_durable.models import WorkItem

        pids = worker_processes(self.supervisors)
        if not pids:
            return
        # The busiest process, if any holds claims: a kill that meets work in flight.
        names = {f"{socket.gethostname()}:{pid}": pid for pid in pids}
        held = retrying(lambda: list(WorkItem.objects.filter(status="processing", claimed_by__in=list(names))
                                     .values_list("claimed_by", "run_id")))
        busy = [names[name] for name, _ in held]
        pid = self.rng.choice(busy) if busy else self.rng.choice(pids)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if "unrecorded-kill" in self.options.breaks and busy:
            self.options.breaks = [b for b in self.options.breaks if b != "unrecorded-kill"] + ["(unrecorded)"]
            return  # (once: the kill is not noted, so its tasks' second runs are unexplained)
        name = f"{socket.gethostname()}:{pid}"
        self.kills.append((time.time(), pid, [str(run_id) for holder, run_id in held if holder == name]))

    def damage(self) -> None:
        """--break: what a bug would leave behind, made from outside the engine."""
        from django_durable.models import WorkflowRun, WorkItem

        if "lost-task" in self.options.breaks:
            result_id = self.enqueued[len(self.enqueued) // 2][0]
            retrying(lambda: WorkflowRun.objects.filter(pk=result_id).delete())
        if "stale-claim" in self.options.breaks:
            result_id = self.enqueued[len(self.enqueued) // 3][0]
            queue = retrying(lambda: WorkflowRun.objects.values_list("queue", flat=True).get(pk=result_id))
            retrying(lambda: WorkItem.objects.update_or_create(  # its end deleted it, if it ended
                run_id=result_id, kind="advance", defaults={"queue": queue, "status": "processing",
                                                            "claimed_by": "nobody:1"}))

    def drain(self) -> float | None:
        from django_durable.models import WorkflowRun

        started = time.monotonic()
        deadline = started + self.options.drain_timeout
        while time.monotonic() < deadline:
            if not retrying(lambda: WorkflowRun.objects.unfinished().exists()):
                return time.monotonic() - started
            time.sleep(0.5)
        return None

    # -- the checks ---------------------------------------------------------------------------------

    def check(self, began: float, ended: float, drained: float | None):
        from django_durable.models import WorkflowEvent, WorkflowRun, WorkItem
        from tests.testapp import ledger

        violations = {name: [] for name in CHECKS}
        runs = {str(row[0]): row for row in retrying(lambda: list(WorkflowRun.objects.values_list(
            "id", "status", "created_at", "finished_at", "last_claimed_at")))}
        killed = {pid for _, pid, _ in self.kills}
        ran: dict[str, list[int]] = {}
        for key, step, pid in ledger.entries():
            if step == "soak":
                ran.setdefault(key, []).append(pid)
        for result_id, key, _ in self.enqueued:
            status = runs.get(result_id, (None, "missing"))[1]
            if status != "completed":
                violations["every task ended SUCCESSFUL"].append(f"{key} ({result_id}): {status}")
            pids = ran.get(key, [])
            if not pids:
                violations["every task ran at least once"].append(f"{key} ({result_id}) never ran")
            elif len(pids) > 1 and not killed & set(pids[:-1]):
                violations["a task run twice had a run in a killed process"].append(
                    f"{key} ran {len(pids)} times, in processes {pids}, none of them killed")
        twice = sum(1 for pids in ran.values() if len(pids) > 1)
        # What the killed processes held, as the database says: the supervisor takes a dead
        # process's claims back at once, the reaper a lease later, and each item so taken back
        # gets a "worker lost" entry naming its worker. (A look at the claims from outside, just
        # before the kill, races with the process ending or giving back what it held.)
        kill_at = {f"{socket.gethostname()}:{pid}": at for at, pid, _ in self.kills}
        reclaims = []
        for run_id, at, data in retrying(lambda: list(WorkflowEvent.objects.filter(
                type=WorkflowEvent.Type.WORKER_LOST).values_list("run_id", "at", "data"))):
            killed_at = kill_at.get(data.get("worker"))
            if killed_at is None:
                violations["a killed process's tasks were claimed again within the lease"].append(
                    f"run {run_id} taken back from {data.get('worker')!r}, which was not killed")
                continue
            reclaims.append(at.timestamp() - killed_at)
            if reclaims[-1] > LEASE:
                violations["a killed process's tasks were claimed again within the lease"].append(
                    f"run {run_id} of killed process {data.get('worker')} taken back {reclaims[-1]:.1f} s after the kill")
        left = retrying(lambda: list(WorkItem.objects.exclude(status__in=["completed", "failed", "cancelled"])
                                     .values_list("id", "status")))
        if left or drained is None:
            violations["nothing left claimed or queued"].append(f"{len(left)} work items: {left[:5]}; "
                                                                f"drained: {drained is not None}")

        def latencies(since: float, until: float) -> list[float]:
            return [(runs[rid][3] - runs[rid][2]).total_seconds() for rid, _, at in self.enqueued
                    if since <= at < until and rid in runs and runs[rid][3] is not None]

        quiet, chaotic = latencies(began, self.chaos_from), latencies(self.chaos_from, ended)
        finished = [row[3] for row in runs.values() if row[3] is not None]
        window = [f for f in finished if self.chaos_from <= f.timestamp() < ended]

        def ms(values: list[float], q: float) -> str:
            if not values:
                return "—"
            ordered = sorted(values)
            return f"{1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.1f} ms"

        figures = {
            "tasks enqueued": len(self.enqueued),
            "seconds (quiet + chaos)": f"{self.chaos_from - began:.0f} + {ended - self.chaos_from:.0f}",
            "tasks finished per second under chaos": f"{len(window) / max(1e-9, ended - self.chaos_from):.1f}",
            "worker processes SIGKILLed": len(self.kills),
            "kills that met tasks in flight": sum(1 for _, _, held in self.kills if held),
            "tasks taken back from killed processes": len(reclaims),
            "reclaim after a kill, median / slowest (lease)": (
                f"{statistics.median(reclaims):.2f} / {max(reclaims):.2f} s ({LEASE:g} s)" if reclaims else "—"),
            "tasks run twice (each in a killed process)": twice,
            "latency enqueue → finished, p50 / p95, quiet": f"{ms(quiet, 0.5)} / {ms(quiet, 0.95)}",
            "latency enqueue → finished, p50 / p95, under chaos": f"{ms(chaotic, 0.5)} / {ms(chaotic, 0.95)}",
            "drained after the chaos in": f"{drained:.1f} s" if drained is not None else "not within the timeout",
        }
        return figures, violations

    def table(self, figures: dict, violations: dict) -> str:
        total = sum(len(found) for found in violations.values())
        lines = [f"tasks soak: seed {self.seed}, {SUPERVISORS} supervisors x {PROCESSES} worker processes, "
                 f"lease {LEASE:g} s, {self.options.rate:g} tasks/s and a burst of {self.options.burst} every 20 s"
                 + (f", broken on purpose: {', '.join(self.options.breaks)}" if self.options.breaks else ""),
                 "", "| figure | value |", "| --- | --- |"]
        lines += [f"| {name} | {value} |" for name, value in figures.items()]
        lines += ["", "| check | violations |", "| --- | --- |"]
        lines += [f"| {name} | {len(found)} |" for name, found in violations.items()]
        examples = [f"  {name}: {message}" for name, found in violations.items() for message in found[:3]]
        if examples:
            lines += ["", "Violations (up to 3 of each):", *examples]
        lines += ["", f"RESULT: {'FAILED' if total else 'ok'} ({total} violation(s))"]
        return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
