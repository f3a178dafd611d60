"""Issue 30: a clean worker start and a schema request print nothing a user (or the database's own
log) should act on, and nothing twice."""

import django
import pytest

# What a worker logs differs between Django versions (django.tasks' own lines on Django 6).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.every_django]


def test_a_worker_under_debug_prints_each_task_line_once(start_worker):
    from tests.testapp.tasks import echo

    results = [echo.enqueue(n) for n in range(3)]
    worker = start_worker(env={"DURABLE_TEST_OWN_LOGGING": "1", "DURABLE_TEST_DEBUG": "1"})
    assert worker.wait(60) == 0, worker.log()
    log = worker.log()
    # Django 6 logs each state at INFO through its "django" logger (printed by its console handler
    # under DEBUG): once, not once more by the worker's handler. The backport logs it at DEBUG.
    expected = 1 if django.VERSION >= (6,) else 0
    for result in results:
        for state in ("RUNNING", "SUCCESSFUL"):
            said = f"Task id={result.id} path=tests.testapp.tasks.echo state={state}"
            assert log.count(said) == expected, log
    assert "WARNING" not in log and "ERROR" not in log and "Traceback" not in log, log


def test_a_worker_without_debug_prints_its_own_lines_and_djangos_warnings_only(start_worker):
    """Without DEBUG, Django's default LOGGING prints nothing of its "django" loggers below ERROR
    (mail to the admins): neither does the worker's own handler, which prints django-durable's lines
    at its verbosity and other loggers' from WARNING up. So django.tasks' line for each task's
    start and success (Django 6) is not printed, nor built; a failure is."""
    from tests.testapp.tasks import echo, fails

    done = [echo.enqueue(n) for n in range(2)]
    failed = fails.enqueue()
    worker = start_worker(env={"DURABLE_TEST_OWN_LOGGING": "1"})
    assert worker.wait(60) == 0, worker.log()
    log = worker.log()
    for result in done:
        assert f"Run {result.id} of tests.testapp.tasks.echo started" in log, log
        assert f"Task id={result.id}" not in log, log
    assert f"Run {failed.id} of tests.testapp.tasks.fails ended failed" in log, log
    if django.VERSION >= (6,):  # the backport logs a task's end at DEBUG
        assert f"Task id={failed.id} path=tests.testapp.tasks.fails state=FAILED" in log, log


def test_a_schema_request_prints_no_warning(admin_client, capsys):
    from drf_spectacular.drainage import reset_generator_stats

    reset_generator_stats()  # drf-spectacular says each warning once per process
    response = admin_client.get("/api/durable/schema/?format=json")
    assert response.status_code == 200
    printed = capsys.readouterr()
    assert "Warning" not in printed.err + printed.out and "Error" not in printed.err + printed.out, printed


@pytest.mark.postgres
def test_workers_starting_together_leave_no_error_in_postgresqls_log():
    """Every worker syncs the declared schedules at start; racing inserts must not be failed INSERTs
    (each an `ERROR: duplicate key value` line in the server's log for an operator alerting on ERROR)."""
    import threading
    from pathlib import Path

    from django.db import connection, connections

    from django_durable import schedules
    from django_durable.models import Schedule

    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        log = Path(cursor.fetchone()[0]).parent / "server.log"  # where scripts/pg-server.sh writes it
    if not log.exists():
        pytest.skip("the server's log is not readable here (DURABLE_TEST_DATABASE_URL names your own server)")
    start = log.stat().st_size
    for _ in range(15):
        Schedule.objects.all().delete()
        barrier = threading.Barrier(4)

        def sync():
            try:
                barrier.wait(timeout=30)
                schedules.sync_declared()
            finally:
                connections.close_all()

        threads = [threading.Thread(target=sync) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert Schedule.objects.filter(slug="tests.nightly").count() == 1
    with open(log, errors="replace") as file:
        file.seek(start)
        errors = [line for line in file if "ERROR" in line and "durable_" in line]
    assert errors == [], errors[:5]
