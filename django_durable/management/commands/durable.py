"""manage.py durable: start, inspect and steer runs from a shell, with exit codes scripts can use.

    start WORKFLOW [--args JSON] [--kwargs JSON] [--wait SECONDS] ...
    status RUN_ID [--steps]        list [--status S] [--workflow W] [--queue Q] [--limit N]
    cancel RUN_ID [--reason R]     signal RUN_ID NAME [--payload JSON]     retry RUN_ID
    schedules [list|sync|pause SLUG|resume SLUG|trigger SLUG]
    prune [--older-than 30d] [--batch 1000] [--dry-run]
    partitions [list|maintain] [--ahead 3] [--keep]
    stats

Exit codes: 0 done; 1 the run's state refused it (or, with start --wait, the run did not
complete); 2 bad arguments or input; 3 no such run, workflow or schedule; 4 start --wait ran
out of time. --json prints machine-readable output.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import sys

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from django_durable import catalog, conf, schedules, serialization, services, stats
from django_durable.exceptions import (
    DurableError,
    InvalidArguments,
    InvalidTransition,
    NotSerializable,
    PayloadTooLarge,
    RunFinished,
    StepNotFound,
    SubjectBusy,
    UpdateRejected,
    WaitTimeout,
    WorkflowFailed,
    WorkflowNotFound,
)
from django_durable.humanize import duration, relative, short_id
from django_durable.models import Schedule, Step, WorkflowRun

REFUSED, BAD_INPUT, NOT_FOUND, TIMED_OUT = 1, 2, 3, 4
UNHEALTHY = 1  # durable health: a check failed (a probe's failure)
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Command(BaseCommand):
    help = "Start, inspect and steer durable workflow runs; prune old ones; print statistics."

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

        start = commands.add_parser("start", help="start a run of a registered workflow")
        start.add_argument("workflow")
        start.add_argument("--args", dest="arguments", default="[]", help="positional arguments, a JSON list")
        start.add_argument("--kwargs", dest="keywords", default="{}", help="keyword arguments, a JSON object")
        start.add_argument("--idempotency-key")
        start.add_argument("--queue")
        start.add_argument("--priority", type=int)
        start.add_argument("--concurrency-key", help="runs of one key share their queue's key_concurrency")
        start.add_argument("--delay", type=float, help="start in this many seconds")
        start.add_argument("--singleton", metavar="KEY", help="at most one unfinished run per key")
        start.add_argument("--debounce", nargs=2, metavar=("KEY", "SECONDS"),
                           help="start once the key has been quiet this long, with the last input")
        start.add_argument("--throttle", nargs=3, metavar=("KEY", "LIMIT", "SECONDS"),
                           help="at most LIMIT runs of the key become ready in any SECONDS")
        start.add_argument("--wait", type=float, metavar="SECONDS", help="wait for the result this long")
        start.add_argument("--json", action="store_true")

        status = commands.add_parser("status", help="a run's status, outcome and steps")
        status.add_argument("run_id")
        status.add_argument("--steps", action="store_true", help="list every step")
        status.add_argument("--json", action="store_true")

        listing = commands.add_parser("list", help="runs, newest first")
        listing.add_argument("--status", help="one status, or several separated by commas")
        listing.add_argument("--workflow")
        listing.add_argument("--queue")
        listing.add_argument("--limit", type=int, default=20)
        listing.add_argument("--json", action="store_true")

        cancel = commands.add_parser("cancel", help="cancel a run (and its unfinished children)")
        cancel.add_argument("run_id")
        cancel.add_argument("--reason")

        signal = commands.add_parser("signal", help="send a signal to a run")
        signal.add_argument("run_id")
        signal.add_argument("name")
        signal.add_argument("--payload", default="null", help="JSON")
        signal.add_argument("--idempotency-key")

        retry = commands.add_parser("retry", help="run a failed, timed-out or cancelled run again from its last checkpoint, or resume a blocked or paused one")
        retry.add_argument("run_id")

        repair = commands.add_parser("repair", help="retry, rerun from a step, cancel or force-fail every run "
                                                    "matching a filter: a dry run unless --apply")
        repair.add_argument("action", choices=["retry", "rerun", "cancel", "force-fail"])
        repair.add_argument("--workflow")
        repair.add_argument("--status", help="one status, or several separated by commas")
        repair.add_argument("--queue")
        repair.add_argument("--created-after", metavar="TIME", help="ISO 8601 with a time zone")
        repair.add_argument("--created-before", metavar="TIME", help="ISO 8601 with a time zone")
        repair.add_argument("--error", metavar="TEXT", help="a piece of the error's text")
        repair.add_argument("--from-step", default="", metavar="KEY", help="rerun: the step to rerun from")
        repair.add_argument("--reason", default="", help="cancel, force-fail: recorded with each run")
        repair.add_argument("--batch", type=int, default=200, help="runs a step of the repair takes (default 200)")
        repair.add_argument("--apply", action="store_true", help="start the repair (default: count and sample only)")
        repair.add_argument("--wait", type=float, metavar="SECONDS", help="with --apply: wait for it this long")
        repair.add_argument("--json", action="store_true")

        steer = commands.add_parser("queues", help="list the queues; pause, resume, limit or clear one at runtime "
                                                   "(every worker, every host)")
        steer.add_argument("action", nargs="?", default="list", choices=["list", "pause", "resume", "limits", "clear"])
        steer.add_argument("name", nargs="?", metavar="QUEUE")
        steer.add_argument("--reason", default="", help="pause: why (shown with it)")
        steer.add_argument("--concurrency", metavar="N", help="limits: items at once (none: drop the override)")
        steer.add_argument("--key-concurrency", metavar="N", help="limits: items of one key at once (none: drop it)")
        steer.add_argument("--rate-limit", metavar="RATE", help="limits: such as 10/s (none: drop it)")
        steer.add_argument("--json", action="store_true")

        sched = commands.add_parser("schedules", help="list, sync, pause, resume or trigger schedules")
        sched.add_argument("action", nargs="?", default="list", choices=["list", "sync", "pause", "resume", "trigger"])
        sched.add_argument("slug", nargs="?")
        sched.add_argument("--json", action="store_true")

        recover = commands.add_parser("recover", help="give runs that nothing will advance their advance back")
        recover.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="only these (default: every stuck run)")
        recover.add_argument("--dry-run", action="store_true", help="list them, change nothing")
        prune = commands.add_parser("prune", help="delete finished runs older than the retention period")
        prune.add_argument("--older-than", metavar="AGE",
                           help="e.g. 30d, 12h, 90m or seconds; default DURABLE_RETENTION")
        prune.add_argument("--batch", type=int, default=1000, help="runs deleted per transaction")
        prune.add_argument("--dry-run", action="store_true", help="count them, delete nothing")

        parts = commands.add_parser("partitions", help="the time partitions of the journal and the runs (PostgreSQL): "
                                                       "list them, make them ahead, drop the journal's empty past ones")
        parts.add_argument("action", nargs="?", default="list", choices=["list", "maintain"])
        parts.add_argument("--ahead", type=int, default=3, help="intervals to have partitions for (default 3)")
        parts.add_argument("--keep", action="store_true", help="with maintain: make and analyze, drop nothing")

        summary = commands.add_parser("stats", help="counts, queue lag, throughput")
        summary.add_argument("--json", action="store_true")

        replay = commands.add_parser("check_replay", help="would the code installed now replay the runs in "
                                                          "flight? non-zero exit if any would break")
        replay.add_argument("--since", help="also runs finished within this (like 7d), which may be retried")
        replay.add_argument("--workflow", help="only runs of this workflow")
        replay.add_argument("--json", action="store_true")

        exported = commands.add_parser("export", help="a run, its journal and its messages as JSON "
                                                      "(durable.testing.load_run() replays it in a test)")
        exported.add_argument("run_id", metavar="RUN_ID")
        exported.add_argument("--output", "-o", help="write to this file instead of standard output")

        listed = commands.add_parser("workflows", help="the registered workflows and tasks, with their shapes")
        listed.add_argument("--json", action="store_true")

        asked = commands.add_parser("update", help="ask a run (ctx.wait_for_update) and print its answer")
        asked.add_argument("run_id", metavar="RUN_ID")
        asked.add_argument("name")
        asked.add_argument("--payload", default="null", help="a JSON value")
        asked.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")

        forked = commands.add_parser("fork", help="a new run of a run's workflow and input from one of its steps: "
                                                  "the journal before it copied, the rest run on today's code")
        forked.add_argument("run_id", metavar="RUN_ID")
        forked.add_argument("--from-step", required=True, metavar="KEY", help="the step's key in the journal")
        forked.add_argument("--json", action="store_true")

        healthy = commands.add_parser("health", help="probes for orchestrators: exit 0 healthy, 1 not "
                                                     "(--probe ready: database and migrations; live: a worker "
                                                     "on this host reports; all: also workers and lag per queue)")
        healthy.add_argument("--probe", choices=["all", "ready", "live"], default="all")
        healthy.add_argument("--queue", dest="queues", action="append", help="check this queue (repeat; default: "
                                                                              "every queue in use)")
        healthy.add_argument("--max-lag", type=float, help="seconds the oldest ready item may wait "
                                                           "(default DURABLE_HEALTH_MAX_LAG_SECONDS)")
        healthy.add_argument("--json", action="store_true")

        described = commands.add_parser("describe", help="a workflow's shape for an input (parameters left out "
                                                         "take their defaults)")
        described.add_argument("workflow")
        described.add_argument("--kwargs", dest="keywords", default="{}", help="the input, a JSON object")
        described.add_argument("--json", action="store_true")

    def handle(self, *args, command, **options):
        self.by = f"cli:{_login()}"
        try:
            if options.get("run_id") is not None:
                options["run_id"] = services.resolve_run_id(options["run_id"])  # or the short id the admin shows
            return getattr(self, f"do_{command}")(**options)
        except (WorkflowNotFound, StepNotFound, Schedule.DoesNotExist) as exc:
            raise CommandError(str(exc) if isinstance(exc, DurableError) else "No such schedule.",
                               returncode=NOT_FOUND) from None
        except (RunFinished, InvalidTransition, SubjectBusy, UpdateRejected) as exc:
            raise CommandError(str(exc), returncode=REFUSED) from None
        except WaitTimeout as exc:  # (durable update)
            raise CommandError(str(exc), returncode=TIMED_OUT) from None
        except (NotSerializable, PayloadTooLarge, ValueError) as exc:
            raise CommandError(str(exc), returncode=BAD_INPUT) from None

    # -- runs -------------------------------------------------------------------------------------

    def do_start(self, *, workflow, arguments, keywords, idempotency_key, queue, priority, concurrency_key, delay,
                 wait, json, singleton=None, debounce=None, throttle=None, **_):
        try:
            run = services.start_run(workflow, _json(arguments, "--args"), _json(keywords, "--kwargs"),
                                     idempotency_key=idempotency_key, queue=queue, priority=priority, delay=delay,
                                     concurrency_key=concurrency_key, by=self.by, singleton=singleton,
                                     debounce=debounce and (debounce[0], _number(debounce[1], "--debounce")),
                                     throttle=throttle and (throttle[0], int(_number(throttle[1], "--throttle")),
                                                            _number(throttle[2], "--throttle")))
        except TypeError as exc:  # --args not a list, --kwargs not an object
            raise ValueError(str(exc)) from None
        if wait is None:
            services.warn_if_unserved(run)  # (with --wait, a timeout says that no worker runs)
        if getattr(run, "warning", None):
            self.stderr.write(f"warning: {run.warning}")
        if wait is None:
            self._print_run(run, json)
            return
        try:
            services.wait(run.pk, timeout=wait)
        except WaitTimeout as timed_out:
            self._print_run(services.get_run(run.pk), json)
            raise CommandError(f"Run {run.pk} did not finish within {wait:g} s."
                               + (f" {timed_out.hint}" if timed_out.hint else ""), returncode=TIMED_OUT) from None
        except WorkflowFailed:
            self._print_run(services.get_run(run.pk), json)
            raise CommandError(f"Run {run.pk} ended {services.get_run(run.pk).status}.", returncode=REFUSED) from None
        self._print_run(services.get_run(run.pk), json)

    def do_status(self, *, run_id, steps, json, **_):
        run = services.get_run(run_id)
        self._print_run(run, json, steps=steps)

    def do_list(self, *, status, workflow, queue, limit, json, **_):
        runs = WorkflowRun.objects.using(conf.get("DATABASE")).defer("input", "result").order_by("-created_at")
        if status:
            runs = runs.filter(status__in=WorkflowRun.statuses_from(status))
        if workflow:
            runs = runs.filter(workflow=workflow)
        if queue:
            runs = runs.filter(queue=queue)
        rows = list(runs[: max(1, limit)])
        if json:
            self._json_out([_run_data(run, steps=False) for run in rows])
            return
        for run in rows:  # the short id, as the admin shows it and `status`, `cancel`, … take it
            self.stdout.write(f"{short_id(run.pk)}  {run.status:<19} {run.workflow:<30} "
                              f"{relative(run.created_at):>14}  {run.waiting_on[:60]}")

    def do_cancel(self, *, run_id, reason, **_):
        run = services.cancel(run_id, reason, by=self.by)
        self.stdout.write(f"{run.pk} {'cancelled' if run.status == 'cancelled' else 'cancel requested'}")

    def do_signal(self, *, run_id, name, payload, idempotency_key, **_):
        message = services.signal(run_id, name, _json(payload, "--payload"), idempotency_key=idempotency_key,
                                  by=self.by)
        self.stdout.write(f"signal {message.name!r} sent to {message.run_id} (message {message.pk})")
        warning = catalog.unawaited_signal(message.workflow, name)
        if warning:
            self.stderr.write(f"warning: {warning}")

    def do_retry(self, *, run_id, **_):
        run = services.retry_run(run_id, by=self.by)
        self.stdout.write(f"{run.pk} {run.status}: it goes again from its last checkpoint")

    def do_repair(self, *, action, workflow, status, queue, created_after, created_before, error, from_step, reason,
                  batch, apply, wait, json, **_):
        from django_durable.services import repairs

        given = {"workflow": workflow, "status": status.split(",") if status else None, "queue": queue,
                 "created_after": created_after, "created_before": created_before, "error": error}
        try:
            run_filter = repairs.RunFilter.parse({name: value for name, value in given.items() if value})
            if not apply:
                plan = repairs.plan(action, run_filter, from_step=from_step)
            else:
                run, plan = repairs.start(action, run_filter, by=self.by, reason=reason, from_step=from_step,
                                          batch=batch)
        except InvalidArguments as exc:
            flag = f"--{exc.argument.replace('_', '-')}: " if exc.argument else ""
            raise ValueError(f"{flag}{exc}") from None
        if json and not apply:
            self._json_out(plan.as_data())
            return
        if not apply:
            self.stdout.write(f"{plan.matched} run(s) match {run_filter}; {action} would take {plan.eligible}.")
            for row in plan.sample:
                self.stdout.write(f"  {short_id(row['id'])}  {row['status']:<19} {row['workflow']:<30} {row['created_at']}")
            if plan.eligible:
                self.stdout.write("Nothing changed: add --apply to do it.")
            return
        self.stdout.write(f"repair {run.pk} started: {action} for {plan.eligible} run(s) matching {run_filter}")
        if wait is None:
            return
        try:
            result = services.wait(run.pk, timeout=wait)
        except WaitTimeout as timed_out:
            raise CommandError(f"The repair {run.pk} did not finish within {wait:g} s."
                               + (f" {timed_out.hint}" if timed_out.hint else ""), returncode=TIMED_OUT) from None
        except WorkflowFailed:
            raise CommandError(f"The repair {run.pk} ended {services.get_run(run.pk).status}; its page says "
                               f"how far it got.", returncode=REFUSED) from None
        if json:
            self._json_out(result)
            return
        skipped = ", ".join(f"{count} {why}" for why, count in result["skipped"].items())
        self.stdout.write(f"{result['done']} {repairs.REPAIRS[action].verb}" + (f"; skipped: {skipped}" if skipped else ""))

    def do_queues(self, *, action, name, reason, concurrency, key_concurrency, rate_limit, json, **_):
        from django_durable.services import queue_control

        if action != "list":
            if not name:
                raise ValueError(f"queues {action} needs a queue's name.")
            if action == "pause":
                queue_control.pause_queue(name, reason=reason, by=self.by)
            elif action == "resume":
                queue_control.resume_queue(name, by=self.by)
            elif action == "clear":
                if not queue_control.clear_queue(name, by=self.by):
                    self.stdout.write(f"{name}: no change made at runtime to clear")
                    return
            else:
                given = {"concurrency": concurrency, "key_concurrency": key_concurrency, "rate_limit": rate_limit}
                queue_control.set_queue_limits(name, by=self.by, **{
                    option: (None if value == "none" else value) if option == "rate_limit"
                    else queue_control.limit_of(value, option)
                    for option, value in given.items() if value is not None})
        states = queue_control.queue_states()
        if action != "list":
            states = [state for state in states if state["name"] == name]
        if json:
            self._json_out(states)
            return
        for state in states:
            paused = "claimed from"
            if state["paused"]:
                paused = f"paused ({state['reason']})" if state["reason"] else "paused"
            overrides = ", ".join(f"{key} {value}" for key, value in state["overrides"].items())
            self.stdout.write(f"{state['name']:<24} {paused:<28} {state['pending']:>7} pending  limits: {state['in_force']}"
                              + (f" (set at runtime: {overrides})" if overrides else ""))

    # -- schedules, housekeeping ---------------------------------------------------------------------

    def do_schedules(self, *, action, slug, json, **_):
        if action == "sync":
            kept, removed = schedules.sync_declared()
            self.stdout.write(f"{kept} declared schedule(s) in place, {removed} no longer declared removed.")
            return
        if action != "list":
            if not slug:
                raise ValueError(f"schedules {action} needs a schedule's slug.")
            if action == "trigger":
                run = schedules.trigger(slug)
                self.stdout.write(f"started run {run.pk} of {run.workflow}")
                return
            schedule = (schedules.pause if action == "pause" else schedules.resume)(slug)
            self.stdout.write(f"{schedule.slug} {schedule.status}")
            return
        rows = list(schedules.list())
        if json:
            self._json_out([{"slug": s.slug, "workflow": s.workflow, "cron": s.cron, "interval": s.interval,
                             "timezone": s.timezone, "status": s.status, "declared": s.declared,
                             "next_fire_at": _iso(s.next_fire_at), "last_run": s.last_run_id and str(s.last_run_id)}
                            for s in rows])
            return
        for s in rows:
            timing = s.cron or f"every {s.interval:g} s"
            upcoming = s.next_fire_at.isoformat() if s.next_fire_at else "-"
            self.stdout.write(f"{s.slug:<30} {s.status:<7} {timing:<20} {s.timezone:<16} next {upcoming}  {s.workflow}")

    def do_recover(self, *, run_ids, dry_run, **_):
        ids = [services.resolve_run_id(run_id) for run_id in run_ids] or None
        if dry_run:
            stuck = WorkflowRun.objects.using(conf.get("DATABASE")).stuck(lease_expired=False)
            if ids is not None:
                stuck = stuck.filter(pk__in=ids)
            rows = list(stuck.values_list("pk", "workflow", "status"))
            for pk, workflow, status in rows:
                self.stdout.write(f"{pk}  {status:<8} {workflow}")
            self.stdout.write(f"{len(rows)} run(s) that nothing will advance would get their advance back.")
            return
        recovered = services.recover(ids, by=self.by)
        for pk in recovered:
            self.stdout.write(str(pk))
        self.stdout.write(f"gave {len(recovered)} run(s) their advance back.")

    def do_prune(self, *, older_than, batch, dry_run, **_):
        from django_durable import retention

        age = _age(older_than) if older_than else None
        kept = (f"older than {duration(age.total_seconds())}" if age is not None else
                f"past their retention (DURABLE_RETENTION: {duration(retention.default_retention().total_seconds())}, "
                f"or their workflow's own)")
        if dry_run:
            self.stdout.write(f"{retention.count(age)} finished run(s) {kept} would be deleted.")
            return
        runs, events = retention.prune(age, batch)
        self.stdout.write(f"deleted {runs} finished run(s) {kept}.")
        if events:
            self.stdout.write(f"deleted {events} emitted event(s) kept longer than DURABLE_EVENT_RETENTION.")

    def do_partitions(self, *, action, ahead, keep, **_):
        from django_durable import partitioning

        if partitioning.layout(refresh=True) is None:
            raise CommandError("The journal is a plain table: nothing to do. Partition it with the "
                               "PartitionJournal migration operation (docs/scaling.md, PostgreSQL only).")
        if ahead < 1:
            raise CommandError(f"--ahead must be at least 1, not {ahead}.")
        if action == "maintain":
            done = partitioning.maintain(ahead=ahead, drop_empty=not keep)
            for name in done["made"]:
                self.stdout.write(f"made {name}")
            for name in done["dropped"]:
                self.stdout.write(f"dropped {name}")
            analyzed = "durable_step" + (" and durable_workflow_run" if partitioning.runs.layout() else "")
            self.stdout.write(f"made {len(done['made'])}, dropped {len(done['dropped'])}; analyzed {analyzed}.")
            return
        empty = {p.name for p in partitioning.droppable()}
        self._list_partitions(partitioning.partitions(), "entries", empty, "no run left: maintain drops it")
        if partitioning.runs.layout(refresh=True) is not None:
            from django_durable import retention

            expired = set(retention.expired_partitions())
            self._list_partitions(partitioning.runs.partitions(), "runs", expired,
                                  "all past their retention: the prune drops it")

    def _list_partitions(self, partitions, what: str, marked: set, why: str) -> None:
        for p in partitions:
            start = "the beginning" if p.start is None else f"{p.start:%Y-%m-%d %H:%M}"
            self.stdout.write(f"{p.name:40} {start:>16} to {p.end:%Y-%m-%d %H:%M}  ~{p.rows:,} {what}"
                              + (f"  ({why})" if p.name in marked else ""))

    def do_check_replay(self, *, since, workflow, json, **_):
        from django_durable.replaycheck import check_replay

        verdicts = list(check_replay(since=_age(since, "--since") if since else None, workflow=workflow))
        broken = [v for v in verdicts if not v.ok]
        if json:
            self._json_out([{"run_id": v.run_id, "workflow": v.workflow, "status": v.status, "ok": v.ok,
                             "reason": v.reason} for v in verdicts])
        else:
            for verdict in broken:
                self.stdout.write(f"{verdict.run_id}  {verdict.status:<8} {verdict.workflow}: {verdict.reason}")
            self.stdout.write(f"{len(verdicts)} run(s) checked, {len(broken)} would not replay on this code.")
        if broken:
            raise CommandError(f"{len(broken)} run(s) would not replay on this code.", returncode=1)

    def do_export(self, *, run_id, output, **_):
        from django_durable.export import export_run

        text = json.dumps(export_run(run_id), indent=1, ensure_ascii=False)
        if output:
            with open(output, "w", encoding="utf-8") as file:
                file.write(text + "\n")
            self.stdout.write(f"wrote run {run_id} to {output}")
        else:
            self.stdout.write(text)

    def do_workflows(self, *, json, **_):
        from django_durable.catalog import workflows

        data = workflows()
        if json:
            self._json_out(data)
            return
        for definition in data:
            summary = (definition["description"].splitlines() or [""])[0]
            self.stdout.write(f"{definition['name']}  ({definition['kind']}, queue {definition['queue']})"
                              + (f"  {summary}" if summary else ""))
            for line in shape_lines(definition.get("shape", []), "    "):
                self.stdout.write(line)
            for problem in definition.get("problems", []):
                self.stdout.write(f"    problem: {problem}")

    def do_update(self, *, run_id, name, payload, timeout, **_):
        from django_durable.services.updates import update

        answer = update(run_id, name, _json(payload, "--payload"), timeout=timeout, by=self.by)
        self.stdout.write(serialization.dumps(answer))

    def do_fork(self, *, run_id, from_step, json, **_):
        run = services.fork(run_id, from_step=from_step, by=self.by)
        self._print_run(run, json)

    def do_health(self, *, probe, queues, max_lag, json, **_):
        from django_durable import health

        data = health.report(probe, queues=queues, max_lag=max_lag)
        if json:
            self._json_out(data)
        else:
            for line in health.as_text(data):
                self.stdout.write(line)
        if not data["ok"]:
            raise CommandError(f"unhealthy ({', '.join(c['name'] for c in data['checks'] if not c['ok'])})",
                               returncode=UNHEALTHY)

    def do_describe(self, *, workflow, keywords, json, **_):
        from django_durable.engine.describe import describe

        keywords = _json(keywords, "--kwargs")
        if not isinstance(keywords, dict):
            raise ValueError("--kwargs must be a JSON object.")
        try:
            data = describe(workflow, **keywords)
        except InvalidArguments as exc:
            raise ValueError(str(exc)) from None
        if json:
            self._json_out(data)
            return
        self.stdout.write(f"{data['workflow']}  ({data['kind']})")
        for line in shape_lines(data["shape"], "    "):
            self.stdout.write(line)
        for problem in data["problems"]:
            self.stdout.write(f"    problem: {problem}")

    def do_stats(self, *, json, **_):
        data = stats.summary()
        if json:
            self._json_out(data)
            return
        unfinished = ", ".join(f"{n} {status}" for status, n in data["unfinished"].items())
        self.stdout.write(f"unfinished: {unfinished}")
        for span in ("last_hour", "last_day"):
            counts = data[f"finished_{span}"]
            self.stdout.write(f"finished in the {span.replace('_', ' ')}: "
                              + ", ".join(f"{n} {label}" for label, n in counts.items()))
        self.stdout.write(f"throughput: {data['finished_per_minute']:g} runs finished a minute over the last hour")
        for queue in data["queues"]:
            line = f"queue {queue['queue']}: {queue['ready']} ready"
            if queue["lag"]:
                line += f", the oldest waited {queue['lag']}"
            line += f"; {queue['running']} running" + (" (full)" if queue["full"] else "")
            if queue["limits"]:
                line += f"; limits: {queue['limits']}"
            self.stdout.write(line)
        if not data["queues"]:
            self.stdout.write("no work is waiting for a worker")
        self.stdout.write(f"workers: {data['workers']['live']} live, {data['workers']['stale']} stale; "
                          f"{data['expired_claims']} claim(s) with an expired lease")
        if data["horizon"]:
            self.stdout.write(f"VACUUM's horizon is held by {data['horizon'][0]['detail']}"
                              + (f" (and {len(data['horizon']) - 1} more)" if len(data["horizon"]) > 1 else ""))

    # -- output ----------------------------------------------------------------------------------

    def _print_run(self, run, as_json: bool, *, steps: bool = False) -> None:
        data = _run_data(run, steps=steps)
        if as_json:
            self._json_out(data)
            return
        self.stdout.write(f"{run.pk} {run.workflow}: {run.status}" + (f" ({run.waiting_on})" if run.waiting_on else ""))
        if run.status == WorkflowRun.Status.COMPLETED:
            self.stdout.write(f"result: {serialization.dumps(data['result'])}")
        if data.get("error"):
            self.stdout.write(f"error: {data['error']['type']}: {data['error']['message']}")
        steps, others = _entry_counts(run)
        self.stdout.write(f"steps: {', '.join(f'{n} {status}' for status, n in steps.items()) or 'none yet'}")
        if others:  # stream values, waits, notes, ...: journal entries that are not steps, named apart
            self.stdout.write("other journal entries: " + ", ".join(f"{n} {kind}" for kind, n in others.items()))
        for step in data.get("steps", []):
            self.stdout.write(f"  {step['seq']:>4} {step['key']:<30} {step['kind']:<8} {step['status']:<9} "
                              f"attempts {step['attempts']}")

    def _json_out(self, data) -> None:
        self.stdout.write(json.dumps(data, indent=2, default=str))


def shape_lines(nodes: list[dict], indent: str) -> list[str]:
    """A workflow's shape (durable.describe()) as indented lines of text."""
    lines = []
    for node in nodes:
        kind = node["type"]
        if kind == "step":
            lines.append(f"{indent}step {node['key']}: {node['function']}"
                         + (f" (compensated by {node['compensate']})" if node.get("compensate") else ""))
        elif kind == "update":
            lines.append(f"{indent}wait for update {node['name']} (and answer it)")
        elif kind in ("signal", "event", "emit"):
            timeout = node.get("timeout")
            lines.append(f"{indent}{'emit' if kind == 'emit' else 'wait for ' + kind} {node['name']}"
                         + ("" if timeout is None else " (with a timeout)" if timeout is True
                            else f" (timeout {timeout:g} s)"))
        elif kind in ("stream", "close"):
            lines.append(f"{indent}{'write to' if kind == 'stream' else 'close'} stream {node['name']}")
        elif kind == "switch":
            lines.append(f"{indent}switch {node['key']}:")
            for branch in node["branches"]:
                lines.append(f"{indent}  branch {branch['id']}:")
                lines.extend(shape_lines(branch["shape"], indent + "    "))
        elif kind == "map":
            lines.append(f"{indent}for each item, in parallel ({node['key']}): {node['function']}")
        elif kind == "parallel":
            lines.append(f"{indent}in parallel ({node['key']}): "
                         + ", ".join(branch["key"] for branch in node["branches"]))
        elif kind == "child":
            lines.append(f"{indent}child {node['key']}: {node['workflow']}")
        elif kind == "approval":
            lines.append(f"{indent}wait for approval {node['key']} by {node['approvers']}")
        elif kind == "agent":
            lines.append(f"{indent}agent {node['agent']}" + (f" on {node['model']}" if node.get("model") else "")
                         + f": model requests and tool calls, each a step {node['keys']}"
                         + (f"; tools {', '.join(node['tools'])}" if node["tools"] else ""))
            lines.extend(f"{indent}  wait for approval before {approval['name']} by {approval['approvers']}"
                         for approval in node.get("approvals", []))
            lines.extend(f"{indent}  {child['name']} runs the child workflow {child['workflow']}"
                         for child in node.get("children", []))
        elif kind == "call":
            lines.append(f"{indent}call {node['function']} (the task, retried as a whole)")
        elif kind == "stop":
            lines.append(f"{indent}… (the shape stops here: {node['reason']})")
        else:
            lines.append(f"{indent}{kind} {node.get('key', '')}".rstrip())
    return lines


# The journal entries that are steps (code that ran); the others are waits, values and markers.
_STEP_KINDS = {"step", "child", "parallel", "rollback", "emit"}
_PLURALS = {"note": "recorded values", "sleep": "sleeps", "signal": "signal waits", "event": "event waits",
            "switch": "switches", "log": "notes", "patch": "code change markers", "approval": "approval waits",
            "stream": "stream values"}


def _entry_counts(run: WorkflowRun) -> tuple[dict, dict]:
    """({status: n} of the run's steps, {kind of entry: n} of its other journal entries), one query."""
    steps: dict = {}
    others: dict = {}
    rows = run.steps.exclude(kind="progress").order_by().values_list("kind", "status").annotate(n=Count("pk"))
    for kind, status, n in rows:
        if kind in _STEP_KINDS:
            status = Step.shown_status(status, kind, run.is_finished)
            steps[status] = steps.get(status, 0) + n
        else:
            name = _PLURALS.get(kind, kind)
            others[name] = others.get(name, 0) + n
    return steps, others


def _run_data(run: WorkflowRun, *, steps: bool) -> dict:
    data = {
        "id": str(run.pk), "workflow": run.workflow, "status": run.status, "waiting_on": run.waiting_on,
        "queue": run.queue, "attempt": run.attempt, "created_at": _iso(run.created_at),
        "started_at": _iso(run.started_at), "finished_at": _iso(run.finished_at),
    }
    if "result" not in run.get_deferred_fields():
        data["result"] = serialization.display(run.result) if run.status == WorkflowRun.Status.COMPLETED else None
        data["error"] = serialization.error_parts(run.error)
        data["step_counts"] = run.step_counts()
    if steps:
        data["steps"] = [
            {"seq": s.seq, "key": s.key, "kind": s.kind, "status": Step.shown_status(s.status, s.kind, run.is_finished),
             "attempts": s.attempts}
            for s in run.steps.order_by("seq")
        ]
    return data


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{what} takes a number, not {text!r}.") from None


def _json(text: str, what: str):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from None


def _age(text: str, option: str = "--older-than") -> dt.timedelta:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not match:
        raise ValueError(f"{option} takes a number with s, m, h or d (like 30d), not {text!r}.")
    return dt.timedelta(seconds=float(match.group(1)) * UNITS[match.group(2) or "s"])


def _iso(moment) -> str | None:
    return moment.isoformat() if moment is not None else None


def _login() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container): still a command-line action
        return str(sys.argv[0])
