"""Programs the tests run, apart from the tests themselves: the chaos soak, PostgreSQL restarts,
a database outage, a transaction pooler, a failover, worker hosts in network namespaces, a project
with the durable tables on a database of their own, the partition conversions, the plans of the
hot statements, a wrong wall clock, and worker processes (workers.py).

Each of the first ones is a module run as ``python -m tests.harness.NAME`` (by a test, or by
``make chaos`` and ``make hosts``), in a process of its own.
"""


def run(module: str, *args: str, timeout: float):
    """Run ``python -m tests.harness.<module> ARGS`` in the checkout, without the test run's
    DURABLE_* settings (each harness makes its own); the CompletedProcess, its output as text.

    The harness runs in a process group of its own, and whatever ends the wait (its `timeout`,
    the test's time limit, an interrupt) ends the whole group: the servers and workers it started
    (PostgreSQL, PgBouncer, worker processes) never outlive it to load the rest of the suite.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")} | {"HARNESS_EXIT_ON_TERM": "1"}
    process = subprocess.Popen([sys.executable, "-m", f"tests.harness.{module}", *args], cwd=Path(__file__).parents[2],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        end_group(process)
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def end_group(process, grace: float = 60.0) -> None:
    """End the harness `process` and its process group: SIGTERM, which the harness turns into
    SystemExit (see below) so that its own clean-up stops the servers and workers it started
    (each in a session of its own); SIGKILL to the group if it has not ended within `grace`."""
    import os
    import signal
    import subprocess

    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    except ProcessLookupError:
        process.wait()


def _exit_on_sigterm() -> None:
    """A harness run by run() ends on SIGTERM as on an error, running its clean-up (Python's own
    SIGTERM ends the process at once, leaving its servers and workers running); and at its exit,
    whatever way, the process groups it started (worker supervisors and their processes, each in
    a session of its own) are killed if they still run."""
    import atexit
    import os
    import signal
    import subprocess
    import sys
    import threading

    if not os.environ.get("HARNESS_EXIT_ON_TERM") or threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    groups: list[subprocess.Popen] = []
    opened = subprocess.Popen.__init__

    def recording(self, *args, **kwargs):
        opened(self, *args, **kwargs)
        if kwargs.get("start_new_session"):
            groups.append(self)

    def kill_groups():
        for process in groups:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass  # the group has ended

    subprocess.Popen.__init__ = recording
    atexit.register(kill_groups)


_exit_on_sigterm()


def stop(processes, logs=(), *, show: bool = False) -> None:
    """SIGTERM `processes` (worker processes), wait for each (a minute, then SIGKILL); with
    `show`, print the end of each log."""
    import signal
    import subprocess

    for process in processes:
        process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
    for log in logs if show else ():
        if log.exists():
            print(log.read_text(errors="replace")[-5000:])


def wait_for(condition, seconds: float, what: str, interval: float = 0.1):
    """Poll `condition` until it returns something truthy and return it; AssertionError naming
    `what` after `seconds` (a harness runs outside pytest)."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s")
        time.sleep(interval)


def listeners(alias: str = "default") -> int:
    """The sessions listening for the workers' notifications on the server `alias` reaches."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN durable_work'")
        return cursor.fetchone()[0]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def verdict(failures: list[str]) -> int:
    """Print each failed check; the harness's exit code (1 if any failed, else 0)."""
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0
