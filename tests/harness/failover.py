"""Through a failover (RELIABILITY T42): a primary and a synchronous standby managed by
pg_auto_failover (a monitor and two nodes on 127.0.0.1), workers and a producer on a multi-host
connection string (`host=a,b target_session_attrs=read-write`); under load the primary's node
dies (its keeper and its postmaster SIGKILLed), the standby is promoted, then the old primary
rejoins as a standby; with --failovers N, again and again, the new primary killed in its turn,
while one run (tests.lives_long) lives through them all.

    python -m tests.harness.failover [--seconds 20] [--failovers 1]     (make failover)
        prints what it measured; exit 0 if every check held, 1 if one did not, 2 if it could not run

Debian's postgresql-15-auto-failover is installed with apt when it is missing (as root).
Checks, as the chaos soak does:
- every run finishes with its expected result (ten-step workflows, runs waiting for signals,
  atomic steps writing an ORM row, a fan-out);
- exactly one ORM row per atomic step;
- no step executed again after its checkpoint committed, beyond the steps in flight at the kill
  (a step whose checkpoint died with the primary runs again: at-least-once);
- no worker process was replaced (no crash loop) and no claim was taken back as a lost worker's;
- every worker listens on the new primary (NOTIFY wake-ups resume), and how long after the
  promotion;
- the time from the kill to the first step completed after it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from tests.harness import free_port, listeners, wait_for
from tests.harness.chaos import ROOT, retrying
BIN = Path("/usr/lib/postgresql/15/bin")
WORKERS = 2
HEALTH = {"health_check_period": 1000, "health_check_timeout": 1000, "health_check_max_retries": 1,
          "health_check_retry_delay": 500, "node_considered_unhealthy_timeout": 5000}


class Skip(Exception):
    pass


def ensure_installed() -> None:
    if shutil.which("pg_autoctl"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Skip("pg_auto_failover is not installed (apt-get install postgresql-15-auto-failover)")
    print("failover: installing postgresql-15-auto-failover with apt-get", flush=True)
    # scripts/apt-install.sh waits for the package manager's lock (another apt at boot), bounded.
    subprocess.run([str(ROOT / "scripts" / "apt-install.sh"), "postgresql-15-auto-failover"],
                   capture_output=True, timeout=1800, check=True)


class Formation:
    """A pg_auto_failover monitor and two Postgres nodes in `workdir`, run as the postgres user."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.ports = {"monitor": free_port(), "node1": free_port(), "node2": free_port()}
        self.keepers: dict[str, subprocess.Popen] = {}
        self.env = {"HOME": str(workdir), "XDG_CONFIG_HOME": str(workdir / "config"),
                    "XDG_DATA_HOME": str(workdir / "data"), "XDG_RUNTIME_DIR": str(workdir / "run"),
                    "PG_CONFIG": str(BIN / "pg_config"), "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
                    "LANG": "C.UTF-8"}

    def _as_owner(self, command: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command

    def autoctl(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(self._as_owner(["pg_autoctl", *args]), env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=self.workdir)
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl {' '.join(args)}: {done.stderr[-3000:]}")
        return done.stdout

    def run(self, name: str, *create: str) -> None:
        """Start the keeper of `name` (creating the node first when `create` is given)."""
        log = open(self.workdir / f"{name}.log", "a")
        command = ["pg_autoctl", *(create or ("run",)), "--pgdata", str(self.workdir / name)]
        if create:
            command.append("--run")
        self.keepers[name] = subprocess.Popen(self._as_owner(command), env=self.env, cwd=self.workdir, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.ports['monitor']}/pg_auto_failover?sslmode=disable"

    def start(self) -> None:
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres", "postgres")
        self.autoctl("create", "monitor", "--pgdata", str(self.workdir / "monitor"), "--pgport",
                     str(self.ports["monitor"]), "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl")
        conf = self.workdir / "monitor" / "postgresql-auto-failover.conf"
        conf.write_text(conf.read_text().replace("listen_addresses = '*'", "listen_addresses = '127.0.0.1'"))
        self.run("monitor")
        self.wait(lambda: self._monitor_up(), 60, "the monitor to accept connections")
        import psycopg

        # Health checks every second and a node unhealthy after 5 s without answers (the defaults,
        # 5 s and 20 s, make the failover take about 50 s).
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{self.ports['monitor']}/pg_auto_failover",
                             autocommit=True) as conn:
            for name, value in HEALTH.items():
                conn.execute(f"ALTER SYSTEM SET pgautofailover.{name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
        for name in ("node1", "node2"):
            self.run(name, "create", "postgres", "--pgport", str(self.ports[name]), "--hostname", "127.0.0.1",
                     "--listen", "127.0.0.1", "--auth", "trust", "--no-ssl", "--dbname", "durable", "--name", name,
                     "--monitor", self.monitor_uri)
            goal = "single" if name == "node1" else "secondary"  # alone, the first is "single"
            self.wait(lambda: self.states().get(name) == goal, 180, f"{name} to become {goal}")
        self.wait(lambda: self.states() == {"node1": "primary", "node2": "secondary"}, 180,
                  "node1 primary and node2 its standby")

    def _monitor_up(self) -> bool:
        try:
            import psycopg

            psycopg.connect(self.monitor_uri, connect_timeout=2).close()
            return True
        except Exception:  # noqa: BLE001 - not yet
            return False

    def states(self) -> dict[str, str]:
        """Each node's current state, as the monitor sees it."""
        import psycopg

        try:
            with psycopg.connect(self.monitor_uri, connect_timeout=2) as conn:
                rows = conn.execute("SELECT nodename, reportedstate FROM pgautofailover.node").fetchall()
        except Exception:  # noqa: BLE001 - the monitor restarting
            return {}
        return {name: str(state) for name, state in rows}

    def wait(self, condition, seconds: float, what: str) -> float:
        """harness.wait_for, saying the nodes' states if it fails; time.monotonic() when it held."""
        try:
            wait_for(condition, seconds, what)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}; states {self.states()}") from None
        return time.monotonic()

    def kill_node(self, name: str) -> None:
        """The node dies: its keeper and its postmaster SIGKILLed (nothing restarts it)."""
        keeper = self.keepers.pop(name)
        os.killpg(keeper.pid, signal.SIGKILL)
        pid_file = self.workdir / name / "postmaster.pid"
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        keeper.wait(timeout=30)

    def stop(self) -> None:
        for name, keeper in list(self.keepers.items()):
            try:
                os.killpg(keeper.pid, signal.SIGTERM)
                keeper.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(keeper.pid, signal.SIGKILL)
        for name in ("node1", "node2", "monitor"):
            if (self.workdir / name / "postmaster.pid").exists():
                subprocess.run(self._as_owner([str(BIN / "pg_ctl"), "-D", str(self.workdir / name), "-m", "immediate",
                                               "stop"]), capture_output=True, timeout=60)


def explain(run_id, runs, sent) -> None:
    """Print what the database holds of an unfinished run: its work items, signals and journal, and
    what the producer meant to send it, so that a failure says where the run stopped."""
    from django_durable.models import SignalMessage, Step, WorkItem

    for item in retrying(lambda: list(WorkItem.objects.filter(run_id=run_id).values(
            "kind", "status", "wake", "attempts", "claimed_by", "claim_expires_at", "available_at", "last_error"))):
        print(f"failover:   item {item}")
    for message in retrying(lambda: list(SignalMessage.objects.filter(run_id=run_id).order_by("id").values(
            "id", "name", "payload", "idempotency_key", "created_at", "consumed_at"))):
        print(f"failover:   signal {message}")
    for step in retrying(lambda: list(Step.objects.filter(run_id=run_id).order_by("seq").values(
            "seq", "key", "kind", "status", "finished_at"))):
        print(f"failover:   step {step}")
    print(f"failover:   the producer meant {runs.get(str(run_id))}, its signals sent "
          f"{sent.get(str(run_id), 'never')} s after the kill")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of load, the kill in the middle")
    parser.add_argument("--failovers", type=int, default=1, help="failovers in a row, each primary killed in turn")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="durable-failover-"))
    workdir.chmod(0o755)
    formation = Formation(workdir)
    workers: list[subprocess.Popen] = []
    stop = threading.Event()
    try:
        ensure_installed()
        started = time.monotonic()
        formation.start()
        print(f"failover: a monitor and two nodes up (node1 primary, node2 its synchronous standby) "
              f"in {time.monotonic() - started:.0f} s", flush=True)
        p1, p2 = formation.ports["node1"], formation.ports["node2"]
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
               "DURABLE_TEST_DATABASE_URL": f"postgres://postgres@127.0.0.1:{p1}/durable",
               "DURABLE_TEST_DB_NAME": "durable", "DURABLE_TEST_HOSTS": f"127.0.0.1:{p1},127.0.0.1:{p2}",
               "DURABLE_LEASE_SECONDS": "5", "DURABLE_HEARTBEAT_SECONDS": "1", "DURABLE_REAPER_INTERVAL": "1",
               "DURABLE_POLL_INTERVAL": "1", "DURABLE_MAX_DELIVERIES": "5", "DURABLE_LOG_LEVEL": "INFO",
               "DURABLE_TEST_LOG_TIMES": "1", "PYTHONUNBUFFERED": "1", "DURABLE_TEST_LEDGER": str(workdir / "ledger.txt")}
        for key in ("DURABLE_FAULTS", "DURABLE_TEST_DIRECT_URL"):
            env.pop(key, None)
        os.environ.update(env)
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, connections

        import django_durable as durable
        from django_durable.models import Step, WorkflowRun
        from tests.testapp import ledger
        from tests.testapp.models import Payment

        call_command("migrate", verbosity=0)
        log = open(workdir / "workers.log", "w")
        workers.append(subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", str(WORKERS)],
                                        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True))

        formation.wait(lambda: retrying(listeners) >= WORKERS, 60, "the workers to listen")
        runs: dict[str, tuple[str, object]] = {}  # run id -> (kind, expected result)
        lock = threading.Lock()
        rng = random.Random(7)
        sent: dict[str, float | None] = {}  # run id -> when its pair was sent (seconds after the kill)
        killed_at: list[float] = []

        def send_pair(run_id: str, first: int) -> None:
            """The run's two signals, each once however often this is retried (a lost answer)."""
            durable.signal(run_id, "go", first, idempotency_key=f"{run_id}:1")
            durable.signal(run_id, "go", first + 1, idempotency_key=f"{run_id}:2")
            sent[run_id] = time.monotonic() - killed_at[0] if killed_at else None

        def produce() -> None:
            """Start runs of each kind, and signal the waiting ones, until stopped."""
            waiting: list[str] = []
            n = 0
            while not stop.is_set():
                kind = ("ten", "ten", "signals", "atomic", "fanout")[n % 5]
                try:
                    if kind == "ten":
                        run = durable.start("tests.ten_steps", pause=0.02)
                        expected = 45
                    elif kind == "signals":
                        run = durable.start("tests.two_signals")
                        expected = [n, n + 1]
                        waiting.append((str(run.pk), n))
                    elif kind == "atomic":
                        run = durable.start("tests.atomic_pay", amount=n)
                        expected = {"amount": n}
                    else:
                        run = durable.start("tests.squares", n=4)
                        expected = [{"x": i, "square": i * i} for i in range(4)]
                    with lock:
                        runs[str(run.pk)] = (kind, expected)
                    while waiting and (len(waiting) > 3 or rng.random() < 0.5):
                        send_pair(*waiting[0])
                        waiting.pop(0)
                except Exception:  # noqa: BLE001 - a start refused during the failover: the producer retries
                    connections.close_all()
                    time.sleep(0.2)
                    continue
                n += 1
                time.sleep(0.05)
            for run_id, first in waiting:
                retrying(lambda: send_pair(run_id, first))

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        lives_long = retrying(lambda: durable.start("tests.lives_long", gap=1.0)).pk  # through every failover
        time.sleep(args.seconds / 2)
        in_flight, measured = 0, []
        primary, standby = "node1", "node2"
        for round_ in range(1, args.failovers + 1):
            with connection.cursor() as cursor:
                cursor.execute("SELECT statement_timestamp()")
                (clock_read,) = cursor.fetchone()
            clock_read_at = time.monotonic()
            connections.close_all()
            with lock:
                before = len(runs)
            unfinished = retrying(lambda: WorkflowRun.objects.exclude(status__in=WorkflowRun.TERMINAL).count())
            in_flight += unfinished
            connections.close_all()
            formation.kill_node(primary)
            killed = time.monotonic()
            killed_at[:] = [killed]
            killed_at_db = clock_read + dt.timedelta(seconds=killed - clock_read_at)  # one machine, one clock
            print(f"failover {round_}: {primary} (the primary) killed with {before} runs started, {unfinished} of "
                  f"them unfinished", flush=True)
            # Promoted: "wait_primary" (a primary whose standby is away; writes accepted), then "primary".
            promoted = formation.wait(lambda: formation.states().get(standby) in ("wait_primary", "primary"), 180,
                                      f"{standby} to be promoted")
            # (A step whose commit reached the primary just before it died may show a moment after
            # the kill: the first step after the promotion is the one that says work resumed.)
            promoted_db = killed_at_db + dt.timedelta(seconds=promoted - killed)
            formation.wait(lambda: retrying(lambda: Step.objects.filter(status="completed",
                                                                        finished_at__gt=promoted_db).exists()),
                           120, "a step to complete after the promotion")
            first_step = retrying(lambda: Step.objects.filter(status="completed", finished_at__gt=promoted_db)
                                  .order_by("finished_at").values_list("finished_at", flat=True).first())
            resumed = (first_step - killed_at_db).total_seconds()
            back = formation.wait(lambda: retrying(listeners) >= WORKERS, 120,
                                  "the workers to listen on the new primary")
            formation.run(primary)  # the old primary comes back: it rejoins as the standby
            rejoined = formation.wait(lambda: formation.states() == {primary: "secondary", standby: "primary"}, 240,
                                      f"{primary} to rejoin as the standby")
            measured.append({"promoted_s": round(promoted - killed, 1), "first_step_after_kill_s": round(resumed, 1),
                             "first_step_after_promotion_s": round(resumed - (promoted - killed), 1),
                             "listening_again_s": round(back - promoted, 1), "rejoined_s": round(rejoined - promoted, 1)})
            print(f"failover {round_}: {standby} promoted {promoted - killed:.1f} s after the kill; the first step "
                  f"completed {resumed:.1f} s after the kill ({resumed - (promoted - killed):.1f} s after the "
                  f"promotion was seen); every worker listening on the new primary {back - promoted:.1f} s after "
                  f"it; {primary} rejoined as the standby {rejoined - promoted:.1f} s after it", flush=True)
            primary, standby = standby, primary
            time.sleep(max(0.0, args.seconds / 2 - (time.monotonic() - killed)))
        retrying(lambda: durable.signal(lives_long, "enough", idempotency_key="enough"))
        stop.set()
        producer.join(timeout=120)
        runs[str(lives_long)] = ("lives_long", None)

        # Drain, then check.
        ids = list(runs)
        try:
            formation.wait(lambda: retrying(lambda: WorkflowRun.objects.filter(id__in=ids)
                                            .exclude(status__in=WorkflowRun.TERMINAL).count()) == 0,
                           240, "every run to finish")
        except RuntimeError:
            for row in WorkflowRun.objects.filter(id__in=ids).exclude(status__in=WorkflowRun.TERMINAL) \
                    .values_list("id", "workflow", "status", "waiting_on")[:10]:
                print(f"failover: unfinished: {row}")
                explain(row[0], runs, sent)
            raise
        from django_durable import serialization

        ended = {str(pk): (status, result) for pk, status, result in
                 retrying(lambda: list(WorkflowRun.objects.filter(id__in=ids).values_list("id", "status", "result")))}
        violations: dict[str, list[str]] = {"wrong result": [], "atomic rows": [], "re-executed": [],
                                            "worker lost or replaced": []}
        for run_id, (kind, expected) in runs.items():
            status, result = ended[run_id]
            got = serialization.decode(result) if result is not None else None
            if kind == "lives_long":  # as many steps as it ran, each once, through every failover
                expected = len({step for run, step, _ in ledger.entries() if run == run_id})
            if kind == "fanout" and isinstance(got, list):
                got = [{"x": r["x"], "square": r["square"]} for r in got]
            if status != "completed" or got != expected:
                violations["wrong result"].append(f"{kind} {run_id}: {status} {got!r}")
        atomic = [run_id for run_id, (kind, _) in runs.items() if kind == "atomic"]
        rows = Counter(str(r) for r in retrying(lambda: list(Payment.objects.filter(run_id__in=atomic)
                                                               .values_list("run_id", flat=True))))
        violations["atomic rows"] = [f"{run_id}: {rows[run_id]}" for run_id in atomic if rows[run_id] != 1]
        executions = Counter((run, step) for run, step, _ in ledger.entries())
        again = [key for key, count in executions.items() if count > 1]
        if len(again) > in_flight + WORKERS * args.failovers:  # each step in flight at a kill may run once more
            violations["re-executed"] = [f"{run} {step}" for run, step in again]
        text = (workdir / "workers.log").read_text(errors="replace")
        replaced = len(re.findall(r"Worker \S+ started", text)) - WORKERS
        # A reaper's take-back ("... after worker W was lost.") or a worker's own loss; not a worker
        # that finds its own end or claim committed although the answer was lost (that is the
        # failover handled: nothing to take back).
        lost = [line for line in text.splitlines() if re.search(r"after worker \S+ was lost|lost its claim", line)]
        if replaced > 0 or lost:
            violations["worker lost or replaced"] = [f"{replaced} processes replaced", *lost[:5]]
            # How each thread met the outage and came back, to tell whose lease ran out and why.
            told = ("Database error", "answers", "Listening", "was lost", "lost its claim", "going on", "started")
            outage = [line[:220] for line in text.splitlines() if any(word in line for word in told)
                      and " of tests." not in line]
        if os.environ.get("DURABLE_FAILOVER_LOG"):  # where to keep the workers' log, to read it after
            Path(os.environ["DURABLE_FAILOVER_LOG"]).write_text(text)
        total = sum(len(v) for v in violations.values())
        kinds = Counter(kind for kind, _ in runs.values())
        print(json.dumps({"runs": len(runs), "by_kind": kinds, "atomic_rows": sum(rows.values()),
                          "steps_run_again": len(again), "in_flight_at_kill": in_flight, **measured[0],
                          "failovers": measured, "violations": total}))
        print(f"failover: {len(runs)} runs ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), "
              f"{sum(rows.values())} atomic rows, {len(again)} steps run again (in flight at the kill: {in_flight}), "
              f"{total} violations")
        for name, found in violations.items():
            for item in found[:10]:
                print(f"VIOLATION {name}: {item}")
        if replaced > 0 or lost:
            print("the workers' log of the outage:", *outage[-20:], sep="\n  ")
        return 1 if total else 0
    except Skip as exc:
        print(f"failover: could not run: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - said, with the logs, as "could not run"
        print(f"failover: could not run: {type(exc).__name__}: {exc}", file=sys.stderr)
        for name in ("monitor", "node1", "node2", "workers"):
            path = workdir / f"{name}.log"
            if path.exists():
                print(f"--- {name}.log\n{path.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        return 2
    finally:
        stop.set()
        for worker in workers:
            try:
                os.killpg(worker.pid, signal.SIGTERM)
                worker.wait(timeout=60)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(worker.pid, signal.SIGKILL)
        formation.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
