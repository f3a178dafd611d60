"""Programs the tests run, apart from the tests themselves: the chaos soak, PostgreSQL restarts,
a database outage, a transaction pooler, a failover, worker hosts in network namespaces, a project
with the durable tables on a database of their own, the partition conversions, the plans of the
hot statements, a wrong wall clock, and worker processes (workers.py).

Each of the first ones is a module run as ``python -m tests.harness.NAME`` (by a test, or by
``make chaos`` and ``make hosts``), in a process of its own.
"""


def run(module: str, *args: str, timeout: float):
    """Run ``python -m tests.harness.<module> ARGS`` in the checkout, without the test run's
    DURABLE_* settings (each harness makes its own); the CompletedProcess, its output as text."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABLE_")}
    return subprocess.run([sys.executable, "-m", f"tests.harness.{module}", *args], cwd=Path(__file__).parents[2],
                          env=env, capture_output=True, text=True, timeout=timeout)


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
