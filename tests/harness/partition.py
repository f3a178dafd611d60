"""A network partition: a worker host alive but cut off from PostgreSQL, then reconnected
(`make partition`, and tests/test_partition.py in the slow tier).

Hosts A and B (tests/harness/hosts.py's network namespaces) each run a supervisor with two worker
processes against a PostgreSQL server in a third. The cut is a packet filter (nftables) in A's
namespace dropping everything between A and the database, both ways, with the link left up: no
error reaches either side, as when a network fails between them. Three rounds:

1. Mid-step: A's two processes are inside steps (one an atomic step with its transaction open,
   one a plain step: A starts alone and takes the first two runs) when the cut comes. A's worker notices within the bound docs/workers.md gives (the TCP
   settings of workpool/listening.py); B takes A's runs over once their leases lapse and finishes
   them; the steps are let go and the link healed: A writes nothing for the runs it lost (the
   journal, the runs and the payments are as B left them), listens for NOTIFY again, and takes
   new runs.
2. Mid-batch: A is draining a backlog of 5,000 tasks in batches (claims taken ahead, completions
   not yet written) when the cut comes; B finishes them all; healed, A's late completions are
   refused, each reported as a lost claim.
3. Stopping while cut off: A is sent SIGTERM while its steps run and the database does not
   answer; its supervisor exits within its bound (the grace, the time to find the database
   silent, the time to hand back), and B finishes A's runs.

After every round: every run and task ended with its result, each step recorded once, each
atomic step's payment written once. Prints "ok: ..." per check and the figures; raises
AssertionError saying what failed. Needs root, `ip` and nftables (installed with apt if missing).

    python -m tests.harness.partition    (DURABLE_HARNESS_KEEP=1 keeps the logs, DURABLE_PARTITION_VERBOSITY=2)
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.harness.hosts import Host, Network, Server, finished, host_of, in_namespaces, live_workers, ok, running_on
from tests.harness.hosts import unavailable as no_namespaces
from tests.harness.workers import ROOT, wait_for

LEASE = 5.0  # seconds: shorter than the cut, so A's claims lapse while it is away
GRACE = 2.0  # host A's --grace: round 3 stops it
CUT = 25.0  # seconds each cut lasts at least: past the lease and past the TCP settings' bound
TASKS = 5000
# The database's side of each of A's sessions: it must end them too (an atomic step's
# transaction would otherwise stay open for the kernel's two hours, holding VACUUM back).
SERVER_SETTINGS = ("tcp_keepalives_idle=5", "tcp_keepalives_interval=2", "tcp_keepalives_count=3",
                   "tcp_user_timeout=15000")


def unavailable() -> str | None:
    why = no_namespaces()
    if why:
        return why
    if shutil.which("nft") is None:
        subprocess.run([str(ROOT / "scripts" / "apt-install.sh"), "nftables"], capture_output=True, timeout=900)
        if shutil.which("nft") is None:
            return "nftables (nft) is missing and could not be installed"
    return None


class Partition:
    def __init__(self, network: Network, server: Server, work: Path):
        self.network, self.server, self.work = network, server, work
        self.figures: dict[str, str] = {}

    # -- set-up -------------------------------------------------------------------------------------

    def run(self) -> None:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DURABLE_TEST_LEDGER": str(self.work / "ledger"),
               "DURABLE_LEASE_SECONDS": str(LEASE), "DURABLE_HEARTBEAT_SECONDS": "1", "DURABLE_REAPER_INTERVAL": "1",
               "DURABLE_POLL_INTERVAL": "2", "DURABLE_LISTEN_NOTIFY": "1", "DURABLE_TEST_OWN_LOGGING": "1"}
        env.pop("DURABLE_TEST_DB_NAME", None)
        os.environ.update({**env, "DURABLE_TEST_DATABASE_URL": self.server.url(None)})
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        verbosity = ("-v", os.environ.get("DURABLE_PARTITION_VERBOSITY", "0"))  # 2: every claim and wake-up
        self.a = Host("a", self.network, self.server, env, self.work, concurrency=2,
                      options=("--grace", str(GRACE), *verbosity))
        self.b = Host("b", self.network, self.server, env, self.work, concurrency=2, options=verbosity)
        try:
            self.a.start()  # alone at first: round 1's first two runs, one of each kind, are A's
            wait_for(lambda: len(self.pids("a")) == 2, 60, message="host A's workers")
            self.mid_step()
            self.mid_batch()
            self.stopping()
        finally:
            for host in (self.a, self.b):
                host.stop()
        width = max(map(len, self.figures))
        for name, value in self.figures.items():
            print(f"{name:<{width}}  {value}")

    # -- round 1 ------------------------------------------------------------------------------------

    def mid_step(self) -> None:
        import django_durable as durable
        from django_durable.models import Step, WorkflowRun
        from tests.testapp.models import Payment

        runs = self.block_everywhere(1, then=self.start_b)
        on_a = [pk for pk, (_, host, _) in runs.items() if host == "a"]
        kinds = sorted(kind for pk, (kind, _, _) in runs.items() if pk in on_a)
        assert kinds == ["block", "pay"], f"host A should hold an atomic and a plain step: {kinds}"

        log_from = len(self.a.log())
        cut_at = time.monotonic()
        self.network.partition(self.network.a)
        # Each of A's processes finds its database gone: the maintenance thread's heartbeat, a
        # statement on a socket nobody answers, ends with an error.
        noticed = wait_for(lambda: self.noticed(log_from, 2), 120, 0.1, message="host A to notice the cut")
        took = noticed - cut_at
        from django_durable.workpool.listening import DEAD_PEER_SECONDS

        # (+ the heartbeat: the first statement after the cut; + 2 s for a busy machine to run the thread)
        bound = DEAD_PEER_SECONDS + 1.0 + 2.0
        assert took <= bound, f"host A took {took:.1f} s to notice the cut, more than {bound} s"
        self.figures["round 1: host A noticed the cut after"] = f"{took:.1f} s (bound {bound:g} s)"
        ok(f"cut mid-step ({', '.join(kinds)} step on host A): both of A's processes noticed within {took:.1f} s")
        for _, host, release in runs.values():
            if host == "b":  # B's own steps end, so that its processes are free to take A's runs
                release.touch()

        wait_for(lambda: finished(runs), 120, message="host B to finish every run, host A's too")
        self.figures["round 1: every run finished after the cut"] = f"{time.monotonic() - cut_at:.1f} s"
        self.check_runs(runs)
        ok(f"host B finished all {len(runs)} runs with their results; each step and payment recorded once")

        journal = sorted(Step.objects.filter(run_id__in=runs).values_list("run_id", "key", "status", "result", "attempts"))
        ended = sorted(WorkflowRun.objects.filter(pk__in=runs).values_list("pk", "status", "result", "last_worker"))
        paid = sorted(Payment.objects.filter(run_id__in=runs).values_list("run_id", "amount"))
        for _, host, release in runs.values():
            if host == "a":  # A's steps return, with nothing to report them to
                release.touch()
        wait_for(lambda: time.monotonic() - cut_at >= CUT, CUT + 5, 0.2, message="the cut's length")
        self.network.heal(self.network.a)
        healed = time.monotonic()
        wait_for(lambda: self.a.log()[log_from:].count("lost its claim") >= len(on_a), 120,
                 message="host A's processes to find their claims lost")
        assert sorted(Step.objects.filter(run_id__in=runs).values_list(
            "run_id", "key", "status", "result", "attempts")) == journal, "host A wrote to the journal after the heal"
        assert sorted(WorkflowRun.objects.filter(pk__in=runs).values_list(
            "pk", "status", "result", "last_worker")) == ended, "host A changed a run after the heal"
        assert sorted(Payment.objects.filter(run_id__in=runs).values_list("run_id", "amount")) == paid
        ok(f"healed: host A wrote nothing for the {len(on_a)} runs it lost (each reported lost)")

        wait_for(lambda: self.listening("a") == 2, 90, 0.2, message="host A's two processes to LISTEN again")
        self.figures["round 1: host A listening again after the heal"] = f"{time.monotonic() - healed:.1f} s"

        def a_takes_one():
            batch = [durable.start("tests.sleeper", 0.2).pk for _ in range(8)]
            wait_for(lambda: finished(batch), 60, message="8 more runs")
            return "a" in {host_of(w) for w in WorkflowRun.objects.filter(pk__in=batch).values_list("last_worker", flat=True)}

        wait_for(a_takes_one, 180, 0, message="host A to take runs again")
        ok("host A listens for NOTIFY again and takes new runs")

    # -- round 2 ------------------------------------------------------------------------------------

    def mid_batch(self) -> None:
        from django.db import transaction

        from django_durable import serialization
        from django_durable.models import WorkflowRun
        from tests.testapp import ledger
        from django_durable.models import WorkItem
        from tests.testapp.tasks import dawdle

        a_pids = self.pids("a")
        with transaction.atomic():  # all at once: a backlog, drained in batches
            ids = [dawdle.enqueue(f"t{i}").id for i in range(TASKS)]
        keys = {f"t{i}" for i in range(TASKS)}

        def ran_on_a() -> int:
            return sum(1 for key, _, pid in ledger.entries() if key in keys and pid in a_pids)

        def a_mid_batch() -> bool:  # A has run some, and holds more claims than it runs at once
            return ran_on_a() >= 50 and WorkItem.objects.filter(
                status="processing", claimed_by__startswith="host-a:").count() > 2

        wait_for(a_mid_batch, 120, 0.01, message="host A to be mid-batch")
        log_from = len(self.a.log())
        cut_at = time.monotonic()
        self.network.partition(self.network.a)
        wait_for(lambda: WorkflowRun.objects.filter(pk__in=ids, status="completed").count() == TASKS, 180,
                 message="host B to finish every task, host A's too")
        rows = sorted(WorkflowRun.objects.filter(pk__in=ids).values_list("pk", "status", "result", "last_worker"))
        wrong = [(pk, status, result) for pk, status, result, _ in rows
                 if status != "completed" or serialization.decode(result) not in keys]
        assert not wrong, f"{len(wrong)} task(s) ended wrong: {wrong[:5]}"
        runs = {}
        for key, _, pid in ledger.entries():
            if key in keys:
                runs.setdefault(key, []).append(pid)
        assert set(runs) == keys, f"{len(keys - set(runs))} task(s) never ran"
        again = {key for key, pids in runs.items() if len(pids) > 1}
        assert all(set(runs[key]) & a_pids for key in again), "a task ran twice that host A never ran"
        assert len(again) >= 2, f"host A held no batch at the cut: {len(again)} of its tasks ran again"
        ok(f"cut mid-batch: host B finished all {TASKS} tasks with their results; the {len(again)} that host A "
           f"had run and not yet reported ran again (at least once)")

        wait_for(lambda: time.monotonic() - cut_at >= CUT, CUT + 5, 0.2, message="the cut's length")
        self.network.heal(self.network.a)
        # Each completion A had not written is refused now, its claim reported lost: it writes none.
        wait_for(lambda: self.a.log()[log_from:].count("lost its claim") >= len(again), 120,
                 message=f"host A to find its {len(again)} unreported tasks' claims lost")
        assert sorted(WorkflowRun.objects.filter(pk__in=ids).values_list(
            "pk", "status", "result", "last_worker")) == rows, "host A changed a task after the heal"
        self.figures["round 2: tasks host A ran, not reported, ran again"] = str(len(again))
        ok(f"healed: host A's {len(again)} late completions were refused; every task as host B left it")
        wait_for(lambda: self.listening("a") == 2, 90, 0.2, message="host A's two processes to LISTEN again")

    # -- round 3 ------------------------------------------------------------------------------------

    def stopping(self) -> None:
        runs = self.block_everywhere(3)
        on_a = sum(1 for _, host, _ in runs.values() if host == "a")
        self.network.partition(self.network.a)
        cut_at = time.monotonic()
        supervisor = self.a.process
        supervisor.send_signal(signal.SIGTERM)
        from django_durable.worker.process import ABANDON_SECONDS
        from django_durable.workpool.listening import DEAD_PEER_SECONDS

        bound = GRACE + DEAD_PEER_SECONDS + ABANDON_SECONDS
        try:
            code = supervisor.wait(timeout=bound + 15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"host A's supervisor still runs {bound + 15:g} s after SIGTERM:\n"
                                 f"{self.a.log()[-4000:]}") from None
        took = time.monotonic() - cut_at
        assert took <= bound + 3, f"host A took {took:.1f} s to stop, more than its bound of {bound:g} s"
        killed = len(re.findall(r"did not stop within", self.a.log()))
        self.figures["round 3: host A stopped, cut off, after"] = (
            f"{took:.1f} s (bound: grace {GRACE:g} + {DEAD_PEER_SECONDS:g} + {ABANDON_SECONDS:g} s; "
            f"{killed} process(es) killed by the supervisor)")
        ok(f"SIGTERM while cut off: host A's supervisor exited with {code} after {took:.1f} s (bound {bound:g} s)")
        for _, _, release in runs.values():
            release.touch()
        self.network.heal(self.network.a)
        wait_for(lambda: finished(runs), 120, message="host B to finish host A's runs")
        self.check_runs(runs)
        ok(f"host B finished the {on_a} runs host A held, each step and payment recorded once")

    # -- helpers ------------------------------------------------------------------------------------

    def start_b(self) -> None:
        self.b.start()
        wait_for(lambda: len(self.pids("b")) == 2, 60, message="host B's workers")

    def block_everywhere(self, round_: int, then=None) -> dict:
        """Four runs, one blocked in step b on each of the four worker processes (two per host),
        alternately an atomic payment and a plain step, each until its own file exists (a second
        execution does not wait); return {run id: (kind, host, that file)}."""
        import django_durable as durable

        runs, releases = {}, {}
        for i in range(4):
            reached, release = self.work / f"reached-{round_}-{i}", self.work / f"release-{round_}-{i}"
            if i % 2 == 0:
                run = durable.start("tests.pay_in_b", 100 * round_ + i, str(reached), str(release))
            else:
                run = durable.start("tests.block_in_b", str(reached), str(release))
            # One at a time: each goes to a process still idle, so every process holds one.
            wait_for(reached.exists, 60, message=f"run {i} to reach step b")
            runs[run.pk], releases[run.pk] = "pay" if i % 2 == 0 else "block", release
            if i == 1 and then is not None:  # (after the first two)
                then()
        hosts = running_on(runs)
        placed = {pk: (kind, host_of(hosts[pk]), releases[pk]) for pk, kind in runs.items()}
        assert sorted(host for _, host, _ in placed.values()) == ["a", "a", "b", "b"], placed
        return placed

    def check_runs(self, runs: dict) -> None:
        from django_durable import serialization
        from django_durable.models import Step, WorkflowRun
        from tests.testapp.models import Payment

        for pk, (kind, _, _) in runs.items():
            run = WorkflowRun.objects.get(pk=pk)
            payments = list(Payment.objects.filter(run_id=pk).values_list("amount", flat=True))
            want = {"amount": payments[0]} if kind == "pay" and payments else "done"
            assert run.status == "completed" and serialization.decode(run.result) == want, (pk, run.status, run.result)
            assert sorted(Step.objects.filter(run_id=pk).values_list("key", flat=True)) == ["a", "b", "c"], pk
            assert len(payments) == (1 if kind == "pay" else 0), f"run {pk}: payments {payments}"

    def noticed(self, log_from: int, processes: int) -> float | None:
        """The time by which `processes` of A's processes logged a database error, or None."""
        found = set(re.findall(r"Database error in maintenance of (host-a:\d+)", self.a.log()[log_from:]))
        return time.monotonic() if len(found) >= processes else None

    def listening(self, host: str) -> int:
        """How many sessions from `host` LISTEN on the database."""
        from django.db import connection

        address = self.network.address(getattr(self.network, host)).rsplit(".", 1)[0] + ".2"
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' AND client_addr = %s",
                           [address])
            return cursor.fetchone()[0]

    def pids(self, host: str) -> set[int]:
        return {int(name.split(":")[1]) for name in live_workers() if host_of(name) == host}


def main() -> int:
    return in_namespaces("partition", lambda network, server, work: Partition(network, server, work).run(),
                         unavailable(), SERVER_SETTINGS)


if __name__ == "__main__":
    sys.exit(main())
