"""System checks for the settings and databases django-durable depends on."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from . import conf


@register("durable")
def check_settings(app_configs=None, **kwargs):
    errors = []
    if not settings.USE_TZ:
        errors.append(Error(
            "django-durable needs USE_TZ = True: leases, timers and deadlines are stored in UTC.",
            hint="Set USE_TZ = True in your settings.",
            id="django_durable.E001",
        ))
    alias = conf.get("DATABASE")
    if alias not in settings.DATABASES:
        errors.append(Error(
            f"DURABLE_DATABASE is {alias!r}, which is not in DATABASES.",
            hint="Name the database alias that holds the durable tables.",
            id="django_durable.E002",
        ))
        return errors
    engine = settings.DATABASES[alias].get("ENGINE", "")
    if not engine.endswith(("postgresql", "sqlite3")):
        errors.append(Error(
            f"django-durable runs on PostgreSQL or SQLite, not on {engine!r}.",
            hint="Point DURABLE_DATABASE at a PostgreSQL (production) or SQLite (development) database.",
            id="django_durable.E003",
        ))
    errors.extend(_check_routing(alias))
    errors.extend(_check_listen_database())
    errors.extend(_check_offload())
    errors.extend(_check_timing())
    errors.extend(_check_retry())
    errors.extend(_check_queues())
    if engine.endswith("sqlite3"):
        options = settings.DATABASES[alias].get("OPTIONS", {})
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            errors.append(Warning(
                "SQLite is not using IMMEDIATE transactions: workers that claim work at the same "
                "time can fail with 'database is locked'.",
                hint=f'Add "transaction_mode": "IMMEDIATE" to DATABASES[{alias!r}]["OPTIONS"].',
                id="django_durable.W001",
            ))
    return errors


def _check_routing(alias):
    """With the durable tables apart, Django's own writes (the admin's transactions, save()) and
    migrations must be routed there, and the other databases must not get the tables."""
    from django.db import DEFAULT_DB_ALIAS, router

    from .models import WorkflowRun

    if alias == DEFAULT_DB_ALIAS:
        return []
    wrong = [name for name in settings.DATABASES
             if router.allow_migrate_model(name, WorkflowRun) != (name == alias)]
    if router.db_for_write(WorkflowRun) == alias and not wrong:
        return []
    return [Error(
        f"DURABLE_DATABASE is {alias!r}, but the database routers do not keep the durable tables there"
        + (f" (their migrations are routed wrongly for {', '.join(map(repr, wrong))})." if wrong else "."),
        hint='Add "django_durable.routers.DurableRouter" to DATABASE_ROUTERS (first).',
        id="django_durable.E008",
    )]


def _check_listen_database():
    alias = conf.get("LISTEN_DATABASE")
    if alias is None:
        return []
    if alias not in settings.DATABASES or not settings.DATABASES[alias].get("ENGINE", "").endswith("postgresql"):
        return [Error(
            f"DURABLE_LISTEN_DATABASE is {alias!r}, which is not a PostgreSQL database of DATABASES.",
            hint="Name an alias that reaches the durable database's server directly (not through a "
                 "transaction pooler), or set it to None.",
            id="django_durable.E012",
        )]
    return []


def _check_offload():
    limit = conf.get("PAYLOAD_OFFLOAD_BYTES")
    if limit is None:
        return []
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        return [Error(f"DURABLE_PAYLOAD_OFFLOAD_BYTES must be a positive number of bytes or None, not {limit!r}.",
                      id="django_durable.E009")]
    if "durable" not in getattr(settings, "STORAGES", {}):
        return [Error(
            "DURABLE_PAYLOAD_OFFLOAD_BYTES is set, but STORAGES has no \"durable\" storage to write large payloads to.",
            hint='Add STORAGES["durable"], e.g. {"BACKEND": "django.core.files.storage.FileSystemStorage", '
                 '"OPTIONS": {"location": "/var/lib/durable"}} or django-storages\' S3 storage.',
            id="django_durable.E009",
        )]
    return []


def _check_timing():
    errors = []
    numbers = {}
    for name in ("LEASE_SECONDS", "HEARTBEAT_SECONDS", "REAPER_INTERVAL", "POLL_INTERVAL", "MAX_DELIVERIES",
                 "CLAIM_BATCH"):
        value = conf.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            errors.append(Error(
                f"DURABLE_{name} must be a positive number, not {value!r}.",
                id="django_durable.E004",
            ))
        else:
            numbers[name] = value
    lease, heartbeat = numbers.get("LEASE_SECONDS"), numbers.get("HEARTBEAT_SECONDS")
    if lease and heartbeat and heartbeat * 2 > lease:
        errors.append(Error(
            f"DURABLE_HEARTBEAT_SECONDS ({heartbeat}) must be at most half of "
            f"DURABLE_LEASE_SECONDS ({lease}), or one late heartbeat loses the lease.",
            hint="Use a heartbeat of about a third of the lease.",
            id="django_durable.E005",
        ))
    return errors


def _check_retry():
    from django.core.exceptions import ImproperlyConfigured

    from .retry import from_setting

    try:
        from_setting(conf.get("DEFAULT_RETRY"))
    except ImproperlyConfigured as exc:
        return [Error(
            str(exc),
            hint="Use a durable.RetryPolicy or a dict of its fields, such as {\"max_attempts\": 5, "
                 "\"initial_backoff\": 1.0}; None means the built-in policy.",
            id="django_durable.E006",
        )]
    return []


def _check_queues():
    from .queues import parse

    try:
        parse(conf.get("QUEUES"))
    except ValueError as exc:
        return [Error(
            str(exc),
            hint='For example DURABLE_QUEUES = {"emails": {"concurrency": 5, "rate_limit": "10/s"}}.',
            id="django_durable.E007",
        )]
    return []


@register(Tags.database, "durable")
def check_sqlite_journal(app_configs=None, databases=None, **kwargs):
    alias = conf.get("DATABASE")
    if not databases or alias not in databases or connections[alias].vendor != "sqlite":
        return []
    with connections[alias].cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        mode = cursor.fetchone()[0]
    if str(mode).lower() not in ("wal", "memory"):
        return [Warning(
            f"SQLite is in journal mode {mode!r}, not WAL: readers block the workers' writes.",
            hint=f'Add "init_command": "PRAGMA journal_mode=WAL;" to DATABASES[{alias!r}]["OPTIONS"].',
            id="django_durable.W002",
        )]
    return []


@register("durable")
def check_workflow_determinism(app_configs=None, **kwargs):
    """Warn about calls in workflow bodies that give a different value on every replay."""
    from . import determinism, registry

    return [
        Warning(
            f"Workflow {name!r} calls {call}() outside a step ({where}): a replay would see a "
            f"different value than the first run did.",
            hint="Use ctx.now(), ctx.uuid() or ctx.random(), or move the call into a step.",
            obj=registry.get(name).fn,
            id="django_durable.W003",
        )
        for name in registry.names()
        for call, where in determinism.nondeterministic_calls(registry.get(name).fn)
    ]


@register("durable")
def check_workflow_shapes(app_configs=None, **kwargs):
    """What a run would fail on, found in each workflow's shape (durable.describe()) before any run
    starts: a key two calls take, approvers naming a permission no model declares. An error where
    the code reaches it whatever the data; a warning where it took a guess about data (an `if`)."""
    from . import registry
    from .engine.describe import problems, stopped

    found = []
    for name in registry.names():
        reason = stopped(name)
        if reason is not None:
            found.append(Warning(
                f"Workflow {name!r}: its shape (durable.describe()) stops before the code's end ({reason}), so "
                f"the checks of its keys and approvers, and its shape in the admin and the API, see nothing past "
                f"that point.", obj=registry.get(name).fn, id="django_durable.W005",
                hint="Give the parameters that code reads a default, or guard code that cannot work on a stand-in "
                     "value; `manage.py durable describe` shows where it stops."))
        for problem in problems(name):
            level, check_id = (Error, "django_durable.E011") if problem.certain else (Warning, "django_durable.W004")
            found.append(level(f"Workflow {name!r}: {problem.message}", obj=registry.get(name).fn, id=check_id,
                               hint="`manage.py durable workflows` shows the workflow's shape with it."))
    return found


@register("durable", deploy=True)
def check_replay_before_deploy(app_configs=None, **kwargs):
    """`manage.py check --deploy` replays the journals of the runs in flight against the code
    installed now (django_durable.replaycheck) and names those it would break (E010), unless
    DURABLE_CHECK_REPLAY is False. Where the database cannot be read (a build step without one),
    a warning (W006) says the replay was not checked."""
    if not conf.get("CHECK_REPLAY"):
        return []
    from django.db import DatabaseError

    from .replaycheck import check_replay

    errors = []
    try:
        for verdict in check_replay():
            if not verdict.ok:
                errors.append(Error(
                    f"Run {verdict.run_id} of {verdict.workflow} ({verdict.status}) would not replay on this code: "
                    f"{verdict.reason}",
                    hint="Restore what the run recorded, or branch on ctx.patched(); "
                         "`manage.py durable check_replay` lists them all.",
                    id="django_durable.E010",
                ))
                if len(errors) >= 20:
                    break
    except DatabaseError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [*errors, Warning(
            f"The runs in flight were not replayed against this code: the database could not be read "
            f"({first_line}).",
            hint="Run `manage.py check --deploy` (or `manage.py durable check_replay`) where the production "
                 "database is reachable, or set DURABLE_CHECK_REPLAY = False to skip it.",
            id="django_durable.W006",
        )]
    return errors
