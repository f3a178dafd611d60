"""manage.py durable_schedules: sync the schedules declared on workflows, or list them."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from django_durable import schedules


class Command(BaseCommand):
    help = "Manage schedules: 'sync' creates/updates the ones declared with @durable.workflow(schedule=...), 'list' shows all."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["sync", "list"])

    def handle(self, *args, action, **options):
        if action == "sync":
            kept, removed = schedules.sync_declared()
            self.stdout.write(f"{kept} declared schedule(s) in place, {removed} no longer declared removed.")
            return
        for schedule in schedules.list():
            timing = schedule.cron or f"every {schedule.interval:g} s"
            upcoming = schedule.next_fire_at.isoformat() if schedule.next_fire_at else "-"
            self.stdout.write(f"{schedule.slug:<30} {schedule.status:<7} {timing:<20} {schedule.timezone:<16} "
                              f"next {upcoming}  {schedule.workflow}")
