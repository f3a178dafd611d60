"""The chaos soak: mixed workflows on three worker supervisors while a driver SIGKILLs worker
processes, restarts PostgreSQL and pauses a worker past its lease; then it drains and checks
every promise of docs/reliability.md.

    python -m tests.harness.chaos [--duration 600] [--seed N] [--db-faults] [--break MODE,...]

It starts a PostgreSQL server of its own (scripts/pg-server.sh), prints one summary table and
exits 1 if any invariant was violated (2 if the soak itself could not run). `--break` damages
the system on purpose, from outside the engine, to show that the checks catch it:

    rewind          delete a completed step from a waiting run's journal (it runs again)
    early-wake      move a sleeping run's wake-up time to now (its sleep ends early)
    double-signal   mark a consumed signal unconsumed (a wait takes it twice)
    unrecorded-kill SIGKILL a worker process without noting it (a worker exits unexplained)
    stale-claim     give a finished run a claimed work item again, with a lease far in the future
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import heapq
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tests.harness import stop

ROOT = Path(__file__).resolve().parents[2]  # the checkout
LEASE = 3.0
KINDS = ["steps", "atomic", "retry", "sleep", "signals", "fanout", "parent", "saga"]
BREAKS = {
    "rewind": "a step re-executed with no fault to explain it",
    "early-wake": "no sleep ended early",
    "double-signal": "signals consumed once each, in order",
    "unrecorded-kill": "no worker process exited except those killed",
    "stale-claim": "nothing left claimed or queued",
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600, help="seconds of chaos (default 600)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rate", type=float, default=4.0, help="runs started per second")
    parser.add_argument("--db-faults", action="store_true",
                        help="also inject random database errors (1%%) in one supervisor's workers (T17)")
    parser.add_argument("--no-faults", action="store_true", help="no kills, restarts or pauses (with --break)")
    parser.add_argument("--break", dest="breaks", default="", help=f"damage on purpose: {', '.join(BREAKS)}")
    parser.add_argument("--min-runs", type=int, default=0,
                        help="go on past --duration until this many runs started (a slow machine starts fewer)")
    parser.add_argument("--drain-timeout", type=float, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    parser.add_argument("--pooler", action="store_true",
                        help="every process through PgBouncer in transaction mode (listening directly)")
    options = parser.parse_args(argv)
    breaks = [b for b in options.breaks.split(",") if b]
    unknown = sorted(set(breaks) - set(BREAKS))
    if unknown:
        parser.error(f"unknown --break {unknown[0]!r}; choose from {', '.join(BREAKS)}")
    seed = options.seed if options.seed is not None else random.randrange(1_000_000)
    return on_own_server("chaos", lambda workdir, server: Soak(options, breaks, seed, workdir, server),
                         pooler=options.pooler, keep=options.keep)


def on_own_server(name: str, soak, *, pooler: bool = False, keep: bool = False) -> int:
    """Run `soak(workdir, server).run()` on a PostgreSQL server of its own (and PgBouncer in front
    with `pooler`), in a working directory removed after (unless `keep`); its exit code, or 2 if
    the soak could not run."""
    workdir = Path(tempfile.mkdtemp(prefix=f"durable-{name}-"))
    os.chmod(workdir, 0o755)
    server = Postgres(workdir / "pg")
    try:
        server.start()
        if pooler:
            server.start_pooler()
        return soak(workdir, server).run()
    except SoakError as exc:
        print(f"{name}: could not run the soak: {exc}", file=sys.stderr)
        return 2
    finally:
        server.stop()
        if not keep:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)


class SoakError(Exception):
    pass


class Postgres:
    """A throwaway PostgreSQL server that the soak may crash-restart."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.url = ""
        self.pooler_url = ""  # PgBouncer in front of it, once start_pooler() ran

    def start_pooler(self) -> None:
        """PgBouncer in transaction mode in front of the server (scripts/pgbouncer.sh)."""
        result = subprocess.run([str(ROOT / "scripts" / "pgbouncer.sh"), "start", str(self.directory.parent / "pooler"),
                                 self.url], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise SoakError(f"PgBouncer did not start: {result.stderr[-2000:]}")
        self.pooler_url = result.stdout.strip().splitlines()[-1]

    def _owner(self, command):
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def start(self) -> None:
        result = subprocess.run([str(ROOT / "scripts" / "pg-server.sh"), "start", str(self.directory)],
                                capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise SoakError(f"PostgreSQL did not start: {result.stderr[-2000:]}")
        self.url = result.stdout.strip().splitlines()[-1]

    def restart(self) -> None:
        """`pg_ctl restart -m immediate`: a crash, then recovery, as after a power cut."""
        pg_ctl = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None) or "pg_ctl"
        subprocess.run(self._owner([str(pg_ctl), "-D", str(self.directory / "data"), "-m", "immediate", "-w",
                                    "-t", "60", "-l", str(self.directory / "server.log"), "restart"]),
                       capture_output=True, timeout=120, check=False)

    def down(self, seconds: float) -> float:
        """Stop the server as a crash does, keep it down `seconds`, start it with its options again;
        return time.monotonic() when it answers."""
        import shlex

        pg_ctl = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))), None) or "pg_ctl"
        data = self.directory / "data"
        started_as = shlex.split((data / "postmaster.opts").read_text())[1:]  # the postgres command line
        options = [arg for n, arg in enumerate(started_as)
                   if arg != "-D" and (n == 0 or started_as[n - 1] != "-D")]
        subprocess.run(self._owner([str(pg_ctl), "-D", str(data), "-m", "immediate", "stop"]),
                       capture_output=True, timeout=120, check=True)
        time.sleep(seconds)
        subprocess.run(self._owner([str(pg_ctl), "-D", str(data), "-w", "-t", "60", "-l",
                                    str(self.directory / "server.log"), "-o", shlex.join(options), "start"]),
                       capture_output=True, timeout=120, check=True)
        return time.monotonic()

    def stop(self) -> None:
        if self.pooler_url:
            subprocess.run([str(ROOT / "scripts" / "pgbouncer.sh"), "stop", str(self.directory.parent / "pooler")],
                           capture_output=True, timeout=120, check=False)
            self.pooler_url = ""
        if self.url:
            subprocess.run([str(ROOT / "scripts" / "pg-server.sh"), "stop", str(self.directory)],
                           capture_output=True, timeout=120, check=False)
            self.url = ""


class Soak:
    def __init__(self, options, breaks, seed, workdir: Path, server: Postgres):
        self.options, self.breaks, self.seed, self.workdir, self.server = options, breaks, seed, workdir, server
        self.rng = random.Random(seed)
        self.ledger = workdir / "ledger.txt"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.runs: dict[str, tuple[str, object]] = {}  # run id -> (kind, argument)
        self.sends: list[tuple[float, str, int]] = []  # (when, run id, index): signals to send
        self.kills: list[tuple[float, int]] = []
        self.restarts: list[tuple[float, float]] = []  # (began, answered again), epoch seconds
        self.pauses: list[tuple[float, float, int]] = []  # (stopped, resumed, pid)
        self.broken: list[str] = []
        self.supervisors: list[subprocess.Popen] = []

    # -- set-up ---------------------------------------------------------------------------------------

    def environment(self) -> dict:
        return environment(self.server, self.workdir, DURABLE_CHAOS_LEDGER=str(self.ledger))

    def setup_django(self) -> None:
        setup_django(self.environment())

    def start_supervisors(self) -> None:
        for group in range(3):
            env = dict(self.environment(), DURABLE_CHAOS_GROUP=f"g{group}")
            if self.options.db_faults and group == 2:
                points = ["after_claim_commit", "before_checkpoint_commit", "after_checkpoint_commit",
                          "before_terminal_commit", "after_heartbeat"]
                env["DURABLE_FAULTS"] = ";".join(f"{point}=chance:0.01+raise" for point in points)
            log = open(self.workdir / f"supervisor-{group}.log", "w")
            self.supervisors.append(subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", "2"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            ))
            log.close()

    def logged_exit(self, pid: int, timeout: float = 30.0) -> bool:
        """Wait (bounded) until a supervisor has logged the exit of worker `pid`, so that the check
        at the end reads it even on a machine so busy that the supervisor is slow to notice."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for log in self.workdir.glob("supervisor-*.log"):
                if f"Worker process {pid} " in log.read_text(errors="replace"):
                    return True
            time.sleep(0.1)
        return False

    def workers(self) -> list[int]:
        return worker_processes(self.supervisors)

    # -- the soak -------------------------------------------------------------------------------------

    def run(self) -> int:
        self.setup_django()
        self.start_supervisors()
        started = time.monotonic()
        threads = [threading.Thread(target=self.produce, daemon=True)]
        if not self.options.no_faults:
            threads.append(threading.Thread(target=self.chaos, daemon=True))
        if self.breaks:
            threads.append(threading.Thread(target=self.damage, daemon=True))
        for thread in threads:
            thread.start()
        deadline = started + self.options.duration
        while time.monotonic() < deadline or len(self.runs) < self.options.min_runs:
            time.sleep(0.5)
            if any(s.poll() is not None for s in self.supervisors):
                raise SoakError("a worker supervisor exited during the soak")
        self.stop.set()
        for thread in threads:
            thread.join(timeout=120)
        drained_in = self.drain()
        stop(self.supervisors)
        report = Checker(self).check(drained_in)
        print(report.table())
        return 1 if report.violations_total() else 0

    def produce(self) -> None:
        index = 0
        next_start = time.monotonic()
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_start:
                next_start = now + self.rng.expovariate(self.options.rate)
                self.start_one(index)
                index += 1
            self.send_due(now)
            time.sleep(0.01)
        self.send_due(float("inf"))  # what remains, so the signal runs can end

    def start_one(self, index: int) -> None:
        import django_durable as durable

        kind = self.rng.choice(KINDS)
        argument = {"steps": self.rng.randint(2, 6), "atomic": self.rng.randint(1, 3), "retry": 2,
                    "sleep": round(self.rng.uniform(1, 3), 2), "signals": 3, "fanout": self.rng.randint(2, 5),
                    "parent": self.rng.randint(1, 9), "saga": None}[kind]
        args = () if argument is None else (argument,)
        run = retrying(lambda: durable.start(f"chaos.{kind}", *args, idempotency_key=f"chaos:{index}"))
        with self.lock:
            self.runs[str(run.pk)] = (kind, argument)
            if kind == "signals":
                # The first before the run waits for it, the others at random while it waits.
                at = time.monotonic()
                for i in range(argument):
                    heapq.heappush(self.sends, (at, str(run.pk), i))
                    at += self.rng.uniform(0.2, 4.0)

    def send_due(self, now: float) -> None:
        import django_durable as durable

        while True:
            with self.lock:
                if not self.sends or self.sends[0][0] > now:
                    return
                _, run_id, i = heapq.heappop(self.sends)
            # An idempotency key per signal: a retry after a lost answer stores nothing twice.
            try:
                retrying(lambda: durable.signal(run_id, "go", f"g{i}", idempotency_key=f"{run_id}:{i}"))
            except durable.DurableError:
                pass  # the run ended already (only when damaged on purpose); the checks see it

    def chaos(self) -> None:
        rng = random.Random(self.seed + 1)
        now = time.monotonic()
        # The first restart comes early enough that even a short soak has one.
        first_restart = rng.uniform(min(20, self.options.duration * 0.3), min(60, self.options.duration * 0.6))
        next_kill, next_restart, next_pause = now + rng.uniform(2, 10), now + first_restart, now + rng.uniform(8, 20)
        while not self.stop.wait(0.1):
            now = time.monotonic()
            workers = self.workers()
            if now >= next_kill and workers:
                next_kill = now + rng.uniform(2, 10)
                victim = rng.choice(workers)
                self.kills.append((time.time(), victim))
                _kill(victim, signal.SIGKILL)
            if now >= next_restart:
                next_restart = now + rng.uniform(20, 60)
                began = time.time()
                self.server.restart()
                self.restarts.append((began, time.time()))
            if now >= next_pause and workers:
                victim = rng.choice(workers)
                stopped = time.time()
                _kill(victim, signal.SIGSTOP)
                self.stop.wait(LEASE + 2.0)  # past its lease: another worker takes its run over
                _kill(victim, signal.SIGCONT)
                self.pauses.append((stopped, time.time(), victim))
                next_pause = time.monotonic() + rng.uniform(15, 40)

    def damage(self) -> None:
        """Break what --break names, once each, from outside the engine."""
        try:
            self._damage()
        except Exception as exc:  # noqa: BLE001 - reported, and the table shows what was not broken
            print(f"chaos: --break failed: {exc!r}", file=sys.stderr)

    def _damage(self) -> None:
        from django.db.models.functions import Now
        from django.utils import timezone

        from django_durable.models import SignalMessage, Step, Timer, WorkflowRun, WorkItem

        pending = list(self.breaks)
        while pending and not self.stop.wait(0.2):
            with self.lock:  # signal runs that will still be sent signals: they will advance again
                waiting = list({run_id for _, run_id, _ in self.sends})
            for mode in list(pending):
                done = False
                if mode == "rewind":
                    row = retrying(lambda: Step.objects.filter(
                        key="warm-up", status="completed", run__status="waiting", run_id__in=waiting)
                        .values_list("run_id", flat=True).first())
                    if row is not None:
                        done = retrying(lambda: Step.objects.filter(run_id=row, key="warm-up").delete()[0]) > 0
                elif mode == "early-wake":
                    row = retrying(lambda: Step.objects.filter(key="nap", status="waiting", run__status="waiting")
                                   .values_list("run_id", flat=True).first())
                    if row is not None:
                        retrying(lambda: Step.objects.filter(run_id=row, key="nap").update(deadline_at=Now()))
                        done = retrying(lambda: Timer.objects.filter(run_id=row, status="pending")
                                        .update(fire_at=Now())) > 0
                elif mode == "double-signal":
                    row = retrying(lambda: SignalMessage.objects.filter(
                        consumed_at__isnull=False, run__status="waiting", run_id__in=waiting)
                        .values_list("pk", flat=True).first())
                    if row is not None:
                        done = retrying(lambda: SignalMessage.objects.filter(pk=row).update(consumed_at=None)) > 0
                elif mode == "stale-claim":
                    row = retrying(lambda: WorkflowRun.objects.filter(status="completed")
                                   .values_list("pk", "queue").first())
                    if row is not None:  # its end deleted its work item: one claimed, as a bug would leave
                        done = bool(retrying(lambda: WorkItem.objects.update_or_create(
                            run_id=row[0], kind="advance", defaults={
                                "queue": row[1], "status": "processing", "claim_token": uuid.uuid4(),
                                "claimed_by": "nobody", "claim_expires_at": timezone.now() + dt.timedelta(days=1)})))
                elif mode == "unrecorded-kill":
                    workers = self.workers()
                    if workers:
                        _kill(workers[0], signal.SIGKILL)
                        done = self.logged_exit(workers[0])
                if done:
                    self.broken.append(mode)
                    pending.remove(mode)

    def drain(self) -> float | None:
        from django_durable.models import WorkflowRun

        started = time.monotonic()
        deadline = started + self.options.drain_timeout
        while time.monotonic() < deadline:
            left = retrying(lambda: WorkflowRun.objects.unfinished().count())
            if left == 0:
                return time.monotonic() - started
            time.sleep(0.5)
        return None


def environment(server: Postgres, workdir: Path, **extra) -> dict:
    """The environment of the soak's processes: the test settings on `server`, short leases."""
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings", DURABLE_TEST_DATABASE_URL=server.pooler_url or server.url,
        DURABLE_TEST_DB_NAME="durable", DURABLE_LEASE_SECONDS=str(LEASE), DURABLE_HEARTBEAT_SECONDS="1",
        DURABLE_REAPER_INTERVAL="1", DURABLE_POLL_INTERVAL="0.2", DURABLE_MAX_DELIVERIES="10",
        DURABLE_LOG_LEVEL="INFO", PYTHONUNBUFFERED="1", DURABLE_TEST_LEDGER=str(workdir / "test-ledger.txt"),
        **extra,
    )
    env.pop("DURABLE_FAULTS", None)
    env.pop("DURABLE_TEST_DIRECT_URL", None)
    if server.pooler_url:  # through the pooler; the listening sessions straight to the server
        env["DURABLE_TEST_DIRECT_URL"] = server.url
    return env


def setup_django(env: dict) -> None:
    """Point this process at the soak's server and create the tables."""
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def worker_processes(supervisors) -> list[int]:
    """The worker processes the supervisors forked. Not every child of a supervisor is one: while
    it starts, the imports its checks make run short-lived programs of their own (`file` for
    platform.architecture(), `ldconfig -p` for ctypes.util.find_library); killed in place of a
    worker, such a child is never logged as a worker's exit."""
    pids = []
    for supervisor in supervisors:
        out = subprocess.run(["pgrep", "-P", str(supervisor.pid), "-f", "durable_worker"], capture_output=True,
                             text=True).stdout
        pids.extend(int(pid) for pid in out.split())
    return pids


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def retrying(call, seconds: float = 180.0):
    """Run `call` (a few ORM statements), retrying while the database restarts."""
    from django.db import DatabaseError, InterfaceError, connections

    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except (DatabaseError, InterfaceError):
            connections.close_all()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Report:
    def __init__(self, soak: Soak, figures: dict, violations: dict[str, list[str]]):
        self.soak, self.figures, self.violations = soak, figures, violations

    def violations_total(self) -> int:
        return sum(len(v) for v in self.violations.values())

    def table(self) -> str:
        soak = self.soak
        lines = [
            f"chaos soak: {soak.options.duration:g} s, seed {soak.seed}, 3 supervisors x 2 worker processes, "
            f"lease {LEASE:g} s" + (", random database faults in one supervisor" if soak.options.db_faults else "")
            + (f", broken on purpose: {', '.join(soak.broken)}" if soak.broken else ""),
            "",
            "| figure | value |",
            "| --- | --- |",
        ]
        lines += [f"| {name} | {value} |" for name, value in self.figures.items()]
        lines += ["", "| invariant | violations |", "| --- | --- |"]
        for name, found in self.violations.items():
            lines.append(f"| {name} | {len(found)} |")
        examples = [f"  {name}: {message}" for name, found in self.violations.items() for message in found[:3]]
        if examples:
            lines += ["", "Violations (up to 3 of each):", *examples]
        lines.append("")
        lines.append(f"RESULT: {'FAILED' if self.violations_total() else 'ok'} "
                     f"({self.violations_total()} violation(s))")
        return "\n".join(lines)


INVARIANTS = (
    "every run ended with its expected result",
    "exactly one ORM row per atomic step",
    "signals consumed once each, in order",
    "no step executed after its checkpoint committed",
    "a step re-executed with no fault to explain it",
    "no sleep ended early",
    "no worker process exited except those killed",
    "nothing left claimed or queued",
)


class Checker:
    """Reads what the soak left behind and checks it against the contract, one invariant a method."""

    def __init__(self, soak: Soak):
        from django_durable.models import Step, WorkflowRun

        self.soak = soak
        self.violations: dict[str, list[str]] = {name: [] for name in INVARIANTS}
        self.runs = {str(r[0]): r for r in retrying(lambda: list(
            WorkflowRun.objects.filter(workflow__startswith="chaos.")
            .values_list("id", "workflow", "status", "result", "parent_id")))}
        self.steps: dict[str, dict] = collections.defaultdict(dict)  # run -> key -> (status, finished_at)
        for run_id, key, status, finished_at in retrying(lambda: list(
                Step.objects.filter(run__workflow__startswith="chaos.")
                .values_list("run_id", "key", "status", "finished_at"))):
            self.steps[str(run_id)][key] = (status, finished_at)
        self.killed = {pid for _, pid in soak.kills}
        # (pid, run) of each run a worker handed back, which it does only when a database error kept
        # it from writing (a restart, an injected fault, a statement a pooler lost): the step it ran
        # runs again from the last checkpoint.
        self.handed_back = {(int(pid), run) for log in sorted(soak.workdir.glob("supervisor-*.log"))
                            for pid, run in re.findall(r"Worker \S+:(\d+) handed run (\S+) back",
                                                       log.read_text(errors="replace"))}

    def started(self, kind: str):
        """(run id, argument) of the runs the soak started of `kind`."""
        return [(run_id, argument) for run_id, (k, argument) in self.soak.runs.items() if k == kind]

    def check(self, drained_in: float | None) -> Report:
        statuses = self.results()
        self.atomic_rows()
        self.signals()
        executions, retries, reexecuted, explained = self.executions()
        exits = self.worker_exits()
        self.leftovers()
        if drained_in is None:
            self.violations["every run ended with its expected result"].append(
                f"runs still unfinished {self.soak.options.drain_timeout:g} s after the chaos stopped")
        soak = self.soak
        figures = {
            "runs started": len(soak.runs),
            "runs by status": ", ".join(f"{status} {n}" for status, n in sorted(statuses.items())),
            "child runs": sum(1 for r in self.runs.values() if r[4] is not None),
            "worker processes SIGKILLed": len(soak.kills),
            "PostgreSQL crash restarts": len(soak.restarts),
            "workers paused past their lease": len(soak.pauses),
            "step executions (ledger)": executions,
            "retries of failed attempts": retries,
            "re-executions (explained by a fault)": f"{reexecuted} ({explained})",
            "worker exits": f"{exits} (killed {len(self.killed)})",
            "runs handed back after a database error": len(self.handed_back),
            "drain time after the chaos": "did not drain" if drained_in is None else f"{drained_in:.1f} s",
        }
        return Report(soak, figures, self.violations)

    def results(self) -> collections.Counter:
        """Every run ended completed with its expected result; no sleep ended early."""
        from django_durable import serialization
        from tests.testapp.chaos import expected

        statuses = collections.Counter()
        wrong = self.violations["every run ended with its expected result"]
        early = self.violations["no sleep ended early"]
        for run_id, (kind, argument) in self.soak.runs.items():
            row = self.runs.get(run_id)
            if row is None:
                wrong.append(f"run {run_id} ({kind}) is missing")
                continue
            statuses[row[2]] += 1
            result = serialization.decode(row[3]) if row[3] else None
            want = expected(kind, argument)
            if row[2] != "completed" or (want is not None and result != want):
                wrong.append(f"run {run_id} ({kind} {argument!r}) ended {row[2]} with {result!r}, not {want!r}")
            elif kind == "sleep":
                before, after = result  # the database's clock, read in the steps around the sleep
                if (after - before).total_seconds() < argument:
                    early.append(f"run {run_id} slept {(after - before).total_seconds():.3f} s of {argument} s")
        return statuses

    def atomic_rows(self) -> None:
        from tests.testapp.models import Payment

        payments = collections.Counter(retrying(lambda: list(Payment.objects.values_list("run_id", "amount"))))
        for run_id, argument in self.started("atomic"):
            for i in range(argument):
                count = payments.get((uuid.UUID(run_id), i), 0)
                if count != 1:
                    self.violations["exactly one ORM row per atomic step"].append(
                        f"run {run_id} step pay{i}: {count} rows")

    def signals(self) -> None:
        """Each signal stored once (idempotency keys), consumed once, by the waits in order."""
        from django_durable import serialization
        from django_durable.models import SignalMessage

        messages = collections.defaultdict(list)
        for run_id, payload, consumed_by, consumed_at in retrying(lambda: list(
                SignalMessage.objects.filter(run__workflow="chaos.signals").order_by("id")
                .values_list("run_id", "payload", "consumed_by", "consumed_at"))):
            messages[str(run_id)].append((serialization.decode(payload), consumed_by, consumed_at))
        found = self.violations["signals consumed once each, in order"]
        for run_id, count in self.started("signals"):
            got = messages.get(run_id, [])
            order = [payload for payload, _, _ in sorted(got, key=lambda m: m[1])]
            takers = {by for _, by, at in got if at is not None}
            if (len(got) != count or len(takers) != count or order != [f"g{i}" for i in range(count)]
                    or "warm-up" not in self.steps[run_id]):
                found.append(f"run {run_id}: {got}")
            waits = [k for k in self.steps[run_id] if k.startswith("signal:go:")]
            if len(waits) != count:
                found.append(f"run {run_id}: {len(waits)} waits recorded")

    def executions(self) -> tuple[int, int, int, int]:
        """No execution after the step's checkpoint; no re-execution without a fault to explain it.

        Return the executions, retries, re-executions and the re-executions explained."""
        soak = self.soak
        paused = {pid: (stopped, resumed) for stopped, resumed, pid in soak.pauses}
        after_commit = self.violations["no step executed after its checkpoint committed"]
        unexplained = self.violations["a step re-executed with no fault to explain it"]
        executions = retries = reexecuted = explained = 0
        by_step = collections.defaultdict(list)
        for entry in _read_ledger(soak.ledger):
            by_step[(entry["run"], entry["key"])].append(entry)
        for (run_id, key), entries in by_step.items():
            executions += len(entries)
            entries.sort(key=lambda e: e["at"])
            status, finished_at = self.steps.get(run_id, {}).get(key, (None, None))
            if status == "completed" and finished_at is not None:
                committed = finished_at.timestamp()
                for entry in entries:
                    if entry["at"] > committed + 0.001 and not _paused_then(entry, paused):
                        after_commit.append(f"run {run_id} step {key!r} ran at {entry['at']:.3f} by pid "
                                            f"{entry['pid']}, after its checkpoint ({committed:.3f})")
            latest: dict[int, dict] = {}  # attempt -> its latest execution
            for entry in entries:
                earlier = latest.get(entry["attempt"])
                latest[entry["attempt"]] = entry
                if earlier is None:
                    retries += entry["attempt"] > 1
                    continue
                reexecuted += 1
                if (earlier["pid"] in self.killed or earlier["pid"] in paused
                        or (earlier["pid"], run_id) in self.handed_back
                        or any(_outage_explains(outage, earlier["at"], entry["at"]) for outage in soak.restarts)
                        or (soak.options.db_faults and "g2" in (earlier["group"], entry["group"]))):
                    explained += 1
                else:
                    outages = "; ".join(f"{began:.3f}–{answered:.3f}" for began, answered in soak.restarts)
                    unexplained.append(f"run {run_id} step {key!r} attempt {entry['attempt']}: pid {earlier['pid']} "
                                       f"at {earlier['at']:.3f}, again by pid {entry['pid']} at {entry['at']:.3f} "
                                       f"(PostgreSQL restarts: {outages or 'none'})")
        return executions, retries, reexecuted, explained

    def worker_exits(self) -> int:
        """Every worker process that exited was killed by the driver; return how many exited."""
        exits = []
        for log in sorted(self.soak.workdir.glob("supervisor-*.log")):
            text = log.read_text(errors="replace")
            exits += [(int(pid), code or killed) for pid, code, killed in
                      re.findall(r"Worker process (\d+) (?:exited with (-?\d+)|was killed by (SIG\w+))", text)]
            exits += [(int(pid), "replace") for pid in re.findall(r"Worker process (\d+) asked to be replaced", text)]
            exits += [(int(pid), "crash") for pid in re.findall(r"Worker process (\d+) crashed", text)]
        self.violations["no worker process exited except those killed"] += [
            f"worker process {pid} exited ({code})" for pid, code in exits if pid not in self.killed
        ]
        return len(exits)

    def leftovers(self) -> None:
        from django_durable.models import WorkItem

        busy = retrying(lambda: list(WorkItem.objects.filter(status__in=["pending", "processing"])
                                     .values_list("id", "kind", "status", "run_id")))
        self.violations["nothing left claimed or queued"] += [f"work item {item}" for item in busy]


def _outage_explains(outage: tuple[float, float], first: float, again: float) -> bool:
    """Whether a restart of PostgreSQL (`outage`: from its start to the server answering again)
    explains a step run at `first` and again at `again`: it began between a second before the
    first and the second."""
    began, _answered = outage
    return first - 1 <= began <= again


def _paused_then(entry, paused) -> bool:
    """A worker resumed from SIGSTOP may start the step it was about to start (at-least-once)."""
    window = paused.get(entry["pid"])
    return window is not None and window[0] <= entry["at"] <= window[1] + 1.0


def _read_ledger(path: Path) -> list[dict]:
    entries = []
    if not path.exists():
        return entries
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 6:
            continue
        run, key, attempt, pid, group, at = parts
        entries.append({"run": run, "key": key, "attempt": int(attempt), "pid": int(pid), "group": group,
                        "at": float(at)})
    return entries


if __name__ == "__main__":
    sys.exit(main())
