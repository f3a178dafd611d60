"""The journal's open waits (a signal, an event, an approval not over yet) indexed by run: the
admin's stuck filter asks of each unfinished run whether it waits for something from outside.
Built CONCURRENTLY on a plain journal (a partitioned one cannot be)."""

from django.db import migrations, models

from ._concurrently import add_index

INDEX = models.Index(fields=["run"], condition=models.Q(("kind__in", ["signal", "event", "approval"]), ("status", "waiting")),
                     name="durable_step_open_waits")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('django_durable', '0033_run_id_tail_index'),
    ]

    operations = [add_index("Step", INDEX)]
