"""Several worker hosts on one PostgreSQL, made of network namespaces: `make hosts`, and
tests/test_hosts.py.

Three namespaces and veth pairs in a private subnet made here: the database "host" runs its own
PostgreSQL server; hosts A and B each run a worker process, reaching it over their own link; this
process (the client) reaches it over a third. Cutting a host's link (its veth down) is a network
partition: that host's workers can neither renew their leases nor write anything.

    python -m tests.harness.hosts          # runs the scenario, printing what held (needs root and `ip`)

Each check prints "ok: ..." and raises AssertionError saying what failed. Everything made is
removed at the end, also after a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.workers import ROOT, wait_for

LEASE = 3.0  # seconds: short, so that a cut-off host's leases lapse quickly
POLL = 2.0


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    if not list(Path("/usr/lib/postgresql").glob("*/bin/postgres")):
        return "PostgreSQL's server binaries are missing"
    probe = f"ddprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*command: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
    return done


class Network:
    """The namespaces, their links and addresses: 10.<n>.<link>.1 is the database's end of each."""

    def __init__(self):
        tag = os.getpid() % 10000
        self.prefix = f"10.{200 + tag % 50}"
        self.db, self.a, self.b = f"dd{tag}db", f"dd{tag}a", f"dd{tag}b"
        self.links = {self.a: (f"dd{tag}a0", f"dd{tag}a1", 1), self.b: (f"dd{tag}b0", f"dd{tag}b1", 2),
                      None: (f"dd{tag}c0", f"dd{tag}c1", 3)}

    def address(self, host) -> str:
        """The database's address as `host` (None: this process) reaches it."""
        return f"{self.prefix}.{self.links[host][2]}.1"

    def up(self) -> None:
        for ns in (self.db, self.a, self.b):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for host, (db_end, host_end, n) in self.links.items():
            sh("ip", "link", "add", db_end, "type", "veth", "peer", "name", host_end)
            sh("ip", "link", "set", db_end, "netns", self.db)
            sh("ip", "-n", self.db, "addr", "add", f"{self.prefix}.{n}.1/24", "dev", db_end)
            sh("ip", "-n", self.db, "link", "set", db_end, "up")
            if host is not None:
                sh("ip", "link", "set", host_end, "netns", host)
            where = ("ip", "-n", host) if host is not None else ("ip",)
            sh(*where, "addr", "add", f"{self.prefix}.{n}.2/24", "dev", host_end)
            sh(*where, "link", "set", host_end, "up")

    def cut(self, host) -> None:
        sh("ip", "-n", host, "link", "set", self.links[host][1], "down")

    def restore(self, host) -> None:
        sh("ip", "-n", host, "link", "set", self.links[host][1], "up")

    def partition(self, host) -> None:
        """Drop every packet between `host` and the database, both ways (nftables in the host's
        namespace), the link left up: neither side hears an error, as when a network fails
        between them. Their sockets wait, and the kernel retransmits, until TCP gives up."""
        db = self.address(host)
        rules = (f"table inet durable_partition {{\n"
                 f"  chain in {{ type filter hook input priority 0; ip saddr {db} drop; }}\n"
                 f"  chain out {{ type filter hook output priority 0; ip daddr {db} drop; }}\n}}\n")
        done = subprocess.run(["ip", "netns", "exec", host, "nft", "-f", "-"], input=rules, capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"nft failed: {done.stderr.strip()}")

    def heal(self, host) -> None:
        sh("ip", "netns", "exec", host, "nft", "delete", "table", "inet", "durable_partition")

    def down(self) -> None:
        sh("ip", "link", "del", self.links[None][1], check=False)
        for ns in (self.a, self.b, self.db):
            sh("ip", "netns", "del", ns, check=False)


class Server:
    """A PostgreSQL server of its own inside the database namespace, listening on its links."""

    def __init__(self, network: Network, directory: Path, settings: tuple[str, ...] = ()):
        self.network, self.dir, self.settings = network, directory, settings
        self.bindir = sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]
        self.process = None

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(self.dir, "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
        sh(*as_postgres, str(self.bindir / "initdb"), "-D", str(self.dir / "data"), "-U", "postgres",
           "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8")
        with open(self.dir / "data" / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {self.network.prefix}.0.0/16 trust\n")
        addresses = ",".join(self.network.address(host) for host in self.network.links)
        log = open(self.dir / "server.log", "w")
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.network.db, *as_postgres, str(self.bindir / "postgres"), "-D",
             str(self.dir / "data"), "-c", f"listen_addresses={addresses}", "-p", "5432", "-k", str(self.dir),
             "-c", "max_connections=100", "-c", "fsync=off", *(a for v in self.settings for a in ("-c", v))],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: sh("ip", "netns", "exec", self.network.db, *as_postgres, str(self.bindir / "pg_isready"),
                         "-h", str(self.dir), "-p", "5432", check=False).returncode == 0, 60, message="PostgreSQL to start")
        sh("ip", "netns", "exec", self.network.db, *as_postgres, str(self.bindir / "createdb"), "-h", str(self.dir),
           "-p", "5432", "durable")

    def url(self, host) -> str:
        return f"postgres://postgres@{self.network.address(host)}:5432/durable"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGQUIT)  # immediate shutdown
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


class Host:
    """A worker process on one host: `manage.py durable_worker` inside its namespace."""

    def __init__(self, name: str, network: Network, server: Server, env: dict, logs: Path, concurrency: int = 4,
                 options: tuple[str, ...] = ()):
        self.name, self.ns = name, getattr(network, name)
        self.env = {**env, "DURABLE_TEST_DATABASE_URL": server.url(self.ns)}
        self.log_path = logs / f"worker-{name}.log"
        self.concurrency, self.options = concurrency, options
        self.process = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c",
             str(self.concurrency), "--name", f"host-{self.name}", *self.options],
            cwd=ROOT, env=self.env, stdout=open(self.log_path, "a"), stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


def scenario(network: Network, server: Server, work: Path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DURABLE_TEST_LEDGER": str(work / "ledger"),
           "DURABLE_LEASE_SECONDS": str(LEASE), "DURABLE_HEARTBEAT_SECONDS": "1", "DURABLE_REAPER_INTERVAL": "1",
           "DURABLE_POLL_INTERVAL": str(POLL), "DURABLE_LOG_LEVEL": "DEBUG", "DURABLE_LISTEN_NOTIFY": "1"}
    env.pop("DURABLE_TEST_DB_NAME", None)
    os.environ.update({**env, "DURABLE_TEST_DATABASE_URL": server.url(None)})
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import django_durable as durable
    from django_durable.models import Step, WorkflowRun, WorkItem
    from tests.testapp import ledger

    call_command("migrate", verbosity=0)
    hosts = {name: Host(name, network, server, env, work) for name in ("a", "b")}
    try:
        for host in hosts.values():
            host.start()
        run_hosts(durable, hosts, network, work, connection, Step, WorkflowRun, WorkItem, ledger)
    finally:
        for host in hosts.values():
            host.stop()


def run_hosts(durable, hosts, network, work, connection, Step, WorkflowRun, WorkItem, ledger):
    def taken_by(ids):
        return set(WorkflowRun.objects.filter(pk__in=ids).values_list("last_worker", flat=True))

    # 1. Runs are shared across hosts.
    wait_for(lambda: {w.split(":")[0] for w in live_workers()} == {"host-a", "host-b"}, 60, message="both hosts' workers")
    ids = [durable.start("tests.sleeper", 0.3).pk for _ in range(24)]
    wait_for(lambda: finished(ids), 120, message="24 runs to complete")
    assert {host_of(w) for w in taken_by(ids)} == {"a", "b"}, taken_by(ids)
    ok(f"24 runs shared by both hosts ({sorted(taken_by(ids))})")

    # 2. NOTIFY crosses hosts: an idle worker is woken by a start made on another host.
    assert "Woken by a notification" in hosts["a"].log() + hosts["b"].log()
    ok("workers on both hosts listen; a start here woke them (NOTIFY across hosts)")

    # 3. Cut host A's link while its steps are running.
    release = work / "release"
    blocked = [durable.start("tests.block_in_b", str(work / f"reached-{i}"), str(release)).pk for i in range(6)]
    wait_for(lambda: all((work / f"reached-{i}").exists() for i in range(6)), 60, message="all six runs to reach step b")
    on = {pk: host_of(w) for pk, w in running_on(blocked).items()}
    cut_off = [pk for pk, host in on.items() if host == "a"]
    assert cut_off and len(cut_off) < 6, f"host A should hold some, not all, of the blocked runs: {on}"
    network.cut(network.a)
    release.touch()
    wait_for(lambda: finished(blocked), 90, message="host B to finish every run, host A's too")
    for pk in cut_off:
        assert host_of(WorkflowRun.objects.get(pk=pk).last_worker) == "b"
        assert sorted(Step.objects.filter(run_id=pk).values_list("key", flat=True)) == ["a", "b", "c"]
    done_b = [entry for entry in ledger.entries() if entry[1] == "b"]
    twice = {run for run, _, _ in done_b if sum(1 for r, _, _ in done_b if r == run) > 1}
    assert twice <= {str(pk) for pk in cut_off}, (twice, on)
    ok(f"host A cut off: its {len(cut_off)} run(s) finished by host B, each step recorded once "
       f"(step b ran twice for {len(twice)}, as a lost lease allows)")

    # 4. The link comes back: host A's late checkpoints are refused, and it carries on.
    journal = sorted(Step.objects.filter(run_id__in=blocked).values_list("run_id", "key", "status", "result", "attempts"))
    runs = sorted(WorkflowRun.objects.filter(pk__in=blocked).values_list("pk", "status", "result", "last_worker"))
    network.restore(network.a)
    wait_for(lambda: hosts["a"].log().count("lost its claim") >= len(cut_off), 120,
             message="host A's workers to find their claims lost")
    assert sorted(Step.objects.filter(run_id__in=blocked).values_list(
        "run_id", "key", "status", "result", "attempts")) == journal
    assert sorted(WorkflowRun.objects.filter(pk__in=blocked).values_list(
        "pk", "status", "result", "last_worker")) == runs
    def host_a_takes_one():
        batch = [durable.start("tests.sleeper", 0.2).pk for _ in range(8)]
        wait_for(lambda: finished(batch), 60, message="8 more runs")
        return "a" in {host_of(w) for w in taken_by(batch)}

    wait_for(host_a_takes_one, 180, 0, message="host A to take runs again")
    ok("the link restored: host A wrote nothing for the runs it lost, and takes new runs again")

    # 5. A lost listening connection: polling meanwhile, then listening again.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' AND client_addr = %s",
                       [f"{network.prefix}.2.2"])
        listeners = [row[0] for row in cursor.fetchall()]
        assert listeners, "host B has no listening session"
        for pid in listeners:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    hosts["a"].stop()  # only host B can take the next run
    wait_for(lambda: "Lost the LISTEN connection" in hosts["b"].log(), 30, message="host B to notice its LISTEN is gone")
    polled = durable.start("tests.sleeper", 0.1).pk
    wait_for(lambda: finished([polled]), 30, message="host B to poll for the run")
    wait_for(lambda: "Listening for notifications again" in hosts["b"].log(), 60, message="host B to listen again")
    ok("host B lost its listening connection: it polled meanwhile and listens again")


def finished(runs) -> bool:
    """Whether every run of `runs` (ids) completed."""
    from django_durable.models import WorkflowRun

    return WorkflowRun.objects.filter(pk__in=list(runs), status="completed").count() == len(runs)


def running_on(runs) -> dict:
    """{run id: its worker} of `runs` (ids), all in a step, once each shows `running` and who runs it.
    A run claimed in a batch shows both only from its worker's first poll (a second in), not from its
    claim: read at once, it would look as if no host held it."""
    from django_durable.models import WorkflowRun

    def shown():
        rows = dict(WorkflowRun.objects.filter(pk__in=list(runs), status="running").values_list("pk", "last_worker"))
        return rows if len(rows) == len(runs) and all(rows.values()) else None

    return wait_for(shown, 60, message="every run to show running, and its worker")


def host_of(worker: str) -> str:
    """The host ("a", "b") of a worker named host-<x>:<pid>."""
    return worker.split(":")[0].removeprefix("host-")


def live_workers() -> list[str]:
    from django_durable.models import Worker

    return list(Worker.objects.filter(stopped_at__isnull=True).values_list("name", flat=True))


def in_namespaces(name: str, scenario, why: str | None, settings: tuple[str, ...] = ()) -> int:
    """Make the network and its server (with `settings`), run scenario(network, server, work),
    then remove everything, also after a failure (which prints the hosts' logs first). Skips,
    saying `why`, when that is not None. DURABLE_HARNESS_KEEP=1 keeps the work directory."""
    if why:
        print(f"skipped: {why}")
        return 0
    work = Path(tempfile.mkdtemp(prefix=f"durable-{name}-"))
    shutil.chown(work, "postgres")
    network = Network()
    server = Server(network, work / "pg", settings)
    try:
        network.up()
        server.start()
        scenario(network, server, work)
    except BaseException:
        for log in sorted(work.glob("worker-*.log")):  # what the hosts said, to read the failure by
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}", file=sys.stderr)
        raise
    finally:
        server.stop()
        network.down()
        if os.environ.get("DURABLE_HARNESS_KEEP"):
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def main() -> int:
    return in_namespaces("hosts", scenario, unavailable())


if __name__ == "__main__":
    sys.exit(main())
