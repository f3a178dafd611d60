"""Fixtures: the database vendor, worker subprocesses, and the checks every worker test ends with."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness.workers import ON_POSTGRES, ROOT, WorkerProcess, wait_for  # noqa: F401 - the tests import them here


# Fixtures that start processes: a test that uses one is marked `processes` (make test-fast leaves them out).
PROCESS_FIXTURES = {"start_worker", "worker_env", "cpu_hog"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep whether the test's body failed on the item, for fixtures that report on failure."""
    outcome = yield
    if call.when == "call":
        item.durable_failed = outcome.get_result().failed


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DURABLE_TEST_DATABASE_URL)")
    for item in items:
        if "postgres" in item.keywords and not ON_POSTGRES:
            item.add_marker(skip)
        if "slow" in item.keywords or PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
        if "browser" in item.keywords:  # the admin's markup differs between Django versions
            item.add_marker(pytest.mark.every_django)


@pytest.fixture
def worker_env(transactional_db):
    """Environment for worker subprocesses: the test database, short leases, quick reaping."""
    from django.db import connection

    env = os.environ.copy()
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"],
        DURABLE_LEASE_SECONDS="2",
        DURABLE_HEARTBEAT_SECONDS="0.5",
        DURABLE_REAPER_INTERVAL="0.5",
        DURABLE_POLL_INTERVAL="0.1",
        DURABLE_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
        PYTHONFAULTHANDLER="1",  # see WorkerProcess.dump_stacks
    )
    env.pop("DURABLE_FAULTS", None)
    return env


@pytest.fixture
def start_worker(worker_env, tmp_path, request):
    """Start worker subprocesses; every one still running at the end of the test is SIGKILLed.
    If the test failed, each worker's log is printed (pytest shows it with the failure)."""
    workers: list[WorkerProcess] = []

    def start(*args: str, concurrency: int = 1, burst: bool = True, faults: str = "", env=None):
        command = [sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", str(concurrency)]
        if burst:
            command.append("--burst")
        command.extend(args)
        process_env = dict(worker_env, **(env or {}))
        if faults:
            process_env["DURABLE_FAULTS"] = faults
        log_path = tmp_path / f"worker-{len(workers)}.log"
        with open(log_path, "w") as log:
            popen = subprocess.Popen(
                command, cwd=ROOT, env=process_env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        worker = WorkerProcess(popen, log_path)
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        if worker.running():
            worker.kill()
    if getattr(request.node, "durable_failed", False):
        for number, worker in enumerate(workers):
            print(f"--- worker {number} ({' '.join(worker.popen.args[3:])}) ---\n{worker.log()}")


def assert_settled():
    """Every run is finished and no work item is left claimed or ready."""
    from django_durable.models import WorkflowRun, WorkItem

    unfinished = list(WorkflowRun.objects.unfinished().values_list("id", "status"))
    assert unfinished == [], f"runs not finished: {unfinished}"
    busy = list(WorkItem.objects.exclude(status__in=["completed", "failed", "cancelled"]).values_list("id", "status", "claimed_by"))
    assert busy == [], f"work items still pending or claimed: {busy}"


class Spy:
    """Counts what a worker in this process asks of the workpool."""

    def __init__(self, monkeypatch):
        from django_durable import workpool
        from django_durable.worker import process

        self.counts = collections.Counter()
        for name in ("claim", "claim_many", "finish_runs"):
            original = getattr(workpool, name)
            monkeypatch.setattr(process.workpool, name, self._counting(name, original))

    def _counting(self, name, original):
        def counted(*args, **kwargs):
            answer = original(*args, **kwargs)
            self.counts[name] += 1
            if name != "claim":
                self.counts[f"{name} items"] += len(answer)
            return answer
        return counted


def replay_again(run_id, **fields) -> None:
    """Send a finished run back to a worker, as if its worker had crashed before its end
    committed: the run ``pending`` (with `fields`), and its advance item, which the end deleted,
    ready again. The next worker replays it from its journal."""
    from django_durable import workpool
    from django_durable.models import WorkflowRun

    workpool.back_to_pending(run_id, db="default", from_statuses=WorkflowRun.TERMINAL, **fields)


def ledger_counts(run_id) -> dict[str, int]:
    from tests.testapp import ledger

    return ledger.counts(run_id)


@pytest.fixture(autouse=True)
def side_effect_ledger(tmp_path, monkeypatch):
    """Every test gets its own ledger file, which worker subprocesses inherit."""
    monkeypatch.setenv("DURABLE_TEST_LEDGER", str(tmp_path / "ledger.txt"))


@pytest.fixture(autouse=True)
def fresh_floors():
    """Each test's claims start from the start of the claim order (claiming.Floors): a floor is a
    process's memory of the last test's items otherwise."""
    from django_durable.workpool.claiming import floors

    floors.clear()


@pytest.fixture(autouse=True)
def no_ready_item_seen():
    """Each test's starts look for a ready item before they decide to NOTIFY (runs.READY_SEEN_SECONDS):
    what a start of the last test saw is not this one's."""
    from django_durable.workpool import runs

    runs._ready_seen.clear()


@pytest.fixture
def approver(django_user_model):
    """alice, a staff user with testapp.approve_refund (an agent's refund tool waits for her)."""
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("alice", "alice@example.com", "a-long-password", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="approve_refund", content_type__app_label="testapp"))
    return django_user_model.objects.get(pk=user.pk)


@pytest.fixture
def cpu_hog():
    """Keep one core busy for the test (a busy loop in a subprocess), as a loaded CI machine would."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        yield hog
    finally:
        hog.kill()
        hog.wait(timeout=10)
