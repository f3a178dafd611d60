"""The durable tables on a database of their own, tried as a project would: run by
tests/test_own_database.py in a process of its own (settings: tests.settings_own_database).

Every check raises AssertionError saying what went wrong; "ok: <check>" lines say what held.
Meanwhile every statement on the project's database is recorded, and at the end none may name a
durable table: the engine, the admin, the API, the command line and the checks all read the durable
database.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def ok(what: str) -> None:
    print(f"ok: {what}", flush=True)


def tables(alias: str) -> set[str]:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        return set(connections[alias].introspection.table_names(cursor))


def burst() -> None:
    """A real worker process until nothing is left to do."""
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "durable_worker", "-c", "2", "--burst"],
                          env=os.environ.copy(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"the worker failed:\n{done.stdout}\n{done.stderr}"


def main() -> None:
    django.setup()
    from django.contrib.auth.models import Group, Permission, User
    from django.core import checks
    from django.core.management import call_command
    from django.db import connections, transaction
    from django.conf import settings
    from django.test import Client, override_settings

    import django_durable as durable
    from django_durable.models import Approval, ApprovalDecision, WorkflowRun
    from tests.testapp.models import Payment

    # 1. Migrations: each database gets its own tables and only those.
    call_command("migrate", verbosity=0)
    call_command("migrate", database="durable", verbosity=0)
    app, runs = tables("default"), tables("durable")
    assert not {t for t in app if t.startswith("durable_")}, f"durable tables on the project's database: {app}"
    assert {"durable_workflow_run", "durable_step", "durable_work_item"} <= runs, runs
    assert not {t for t in runs if not t.startswith(("durable_", "django_migrations"))}, \
        f"other apps' tables on the durable database: {runs}"
    ok("migrate puts the durable tables on DURABLE_DATABASE and nothing else there")

    # 2. The system check wants the router.
    assert not [e for e in checks.run_checks() if e.id == "django_durable.E008"]
    with override_settings(DATABASE_ROUTERS=[]):
        from django.db import router

        router.routers = []  # the router list is cached on first use
        # (W005: the test app's workflows that fail on purpose, silenced for the commands.)
        assert [e.id for e in checks.run_checks() if e.id.startswith("django_durable")
                and e.id not in settings.SILENCED_SYSTEM_CHECKS] == ["django_durable.E008"]
        del router.__dict__["routers"]
    ok("without the router, the system check says so (E008)")

    statements: list[str] = []

    def record(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connections["default"].execute_wrapper(record):
        exercise(durable, Group, Permission, User, WorkflowRun, Approval, ApprovalDecision, Payment,
                 transaction, call_command, Client)
    durable_on_default = [sql for sql in statements if "durable_" in sql]
    assert not durable_on_default, f"statements on the project's database naming durable tables: {durable_on_default[:5]}"
    assert statements, "nothing was recorded on the project's database (the recorder is broken)"
    ok(f"none of {len(statements)} statements on the project's database named a durable table")


def exercise(durable, Group, Permission, User, WorkflowRun, Approval, ApprovalDecision, Payment,
             transaction, call_command, Client):
    def status(pk):
        return WorkflowRun.objects.get(pk=pk).status

    # 3. Starting: outside a transaction; inside one of the durable database; refused inside one of
    # the project's database (the run could not commit or roll back with it).
    run = durable.start("tests.echo", "hello")
    assert WorkflowRun.objects.using("durable").filter(pk=run.pk).exists()
    before = WorkflowRun.objects.count()
    try:
        with transaction.atomic():
            durable.start("tests.echo", "in the project's transaction")
    except durable.OtherDatabase as exc:
        assert "transaction of database 'default'" in str(exc) and "on_commit" in str(exc), str(exc)
    else:
        raise AssertionError("a start inside a transaction of the project's database was not refused")
    assert WorkflowRun.objects.count() == before
    try:
        with transaction.atomic(using="durable"):
            durable.start("tests.echo", "rolled back")
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert WorkflowRun.objects.count() == before
    with transaction.atomic(using="durable"):
        durable.start("tests.echo", "committed")
    assert WorkflowRun.objects.count() == before + 1
    ok("a start commits with a transaction of the durable database, and is refused in one of another")

    # 4. A subject on the project's database; steps writing there, atomic or not.
    group = Group.objects.create(name="approvers")
    about = durable.start("tests.echo", "about a group", subject=group)
    assert [r.pk for r in durable.runs_for(group)] == [about.pk]
    assert WorkflowRun.objects.get(pk=about.pk).subject == group
    plain = durable.start("tests.plain_pay", 7)
    atomic = durable.start("tests.atomic_pay", 9)
    approver = User.objects.create_user("alice", password="pw", is_staff=True)
    approver.user_permissions.add(Permission.objects.get(codename="approve_refund", content_type__app_label="testapp"))
    waiting = durable.start("tests.refund_approval", 25)
    doomed = durable.start("tests.approval")
    burst()
    assert WorkflowRun.objects.get(pk=run.pk).get_result() == {"args": ["hello"], "kwargs": {}}
    assert (status(plain.pk), list(Payment.objects.filter(run_id=plain.pk).values_list("amount", flat=True))) \
        == ("completed", [7])
    failed = WorkflowRun.objects.get(pk=atomic.pk)
    assert failed.status == "failed" and "OtherDatabase" in failed.error and "atomic=True" in failed.error, failed.error
    assert not Payment.objects.filter(run_id=atomic.pk).exists(), "the refused write was made"
    ok("a plain step writes the project's database; an atomic one writing there fails at once, writing nothing")

    # 5. The admin, logged in on the project's database, shows and acts on the durable one.
    User.objects.create_superuser("admin", password="pw")
    browser = Client()
    assert browser.login(username="admin", password="pw")
    runs_page = browser.get("/admin/django_durable/workflowrun/")
    assert runs_page.status_code == 200 and run.short_id in runs_page.content.decode()
    page = browser.get(f"/admin/django_durable/workflowrun/{atomic.pk}/change/")
    assert page.status_code == 200 and "atomic=True" in page.content.decode()
    for url in ("/admin/django_durable/overview/", "/admin/django_durable/workitem/", "/admin/django_durable/worker/",
                "/admin/django_durable/definition/", "/admin/"):
        assert browser.get(url).status_code == 200, url
    ok("the admin's run list, run page, overview and pool pages read the durable database")

    # 6. An approval decided in the admin by a user of the project's database.
    alice = Client()
    assert alice.login(username="alice", password="pw")
    approval = Approval.objects.get(run_id=waiting.pk)
    assert "Refund 25 EUR?" in alice.get("/admin/django_durable/approval/").content.decode()
    decided = alice.post(f"/admin/django_durable/approval/{approval.pk}/", {"decision": "approve", "comment": "ok"})
    assert decided.status_code == 302, decided.status_code
    assert ApprovalDecision.objects.get(approval=approval).user_id == approver.pk

    # 7. The REST API: status and cancel.
    api = Client()
    api.force_login(User.objects.get(username="admin"))
    shown = api.get(f"/api/durable/workflows/{doomed.pk}/")
    assert shown.status_code == 200 and shown.json()["status"] == "waiting", shown.content
    cancelled = api.delete(f"/api/durable/workflows/{doomed.pk}/")
    assert cancelled.status_code in (200, 202), cancelled.content
    burst()
    assert status(waiting.pk) == "completed" and status(doomed.pk) == "cancelled"
    assert api.get("/api/durable/workflows/?status=failed").json()["results"][0]["id"] == str(atomic.pk)
    ok("an approval decided in the admin and a cancel over HTTP reach the runs")

    # 8. A deleted user leaves no id behind in the durable tables.
    approver.delete()
    assert ApprovalDecision.objects.get(approval=approval).user_id is None
    assert ApprovalDecision.objects.get(approval=approval).username == "alice"
    ok("deleting a user on the project's database forgets its id in the durable one")

    # 9. The command line and the metrics.
    out = io.StringIO()
    call_command("durable", "stats", stdout=out)
    assert "completed" in out.getvalue(), out.getvalue()
    out = io.StringIO()
    call_command("durable", "list", "--status", "failed", stdout=out)
    assert atomic.short_id in out.getvalue() or str(atomic.pk) in out.getvalue(), out.getvalue()
    metrics = api.get("/durable/metrics/")
    assert metrics.status_code == 200 and 'durable_runs_finished{outcome="failed",queue="default"} 1.0' \
        in metrics.content.decode(), metrics.content.decode()
    out = io.StringIO()
    call_command("durable", "prune", "--older-than", "0s", stdout=out)
    assert not WorkflowRun.objects.filter(pk=run.pk).exists(), out.getvalue()
    ok("durable stats, list and prune, and the metrics, read and write the durable database")


if __name__ == "__main__":
    main()
