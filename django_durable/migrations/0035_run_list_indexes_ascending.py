"""The run list's three indexes (all runs, by status, by workflow) in ascending order, read backwards
for the list's newest first. Runs are created in time order, so in descending order every start
inserted its entries at the first leaf page of each index, which PostgreSQL splits in halves and
finds by a descent from the root each time; in ascending order they go to the last page, which it
fills before splitting and reaches directly. Measured over 50,000 starts: 149 bytes of these
indexes a run against 266.

Each new index is built before the old one goes, both CONCURRENTLY where the runs table is plain
(as 0028 builds its index): the table holds every run ever started.
"""

from django.db import migrations, models

from ._concurrently import add_index, remove_index


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ('django_durable', '0034_step_open_waits'),
    ]

    operations = [
        add_index("WorkflowRun", models.Index(fields=["status", "created_at", "id"], name="durable_run_status_created")),
        add_index("WorkflowRun", models.Index(fields=["workflow", "created_at", "id"],
                                              name="durable_run_workflow_created")),
        add_index("WorkflowRun", models.Index(fields=["created_at", "id"], name="durable_run_created")),
        remove_index("WorkflowRun", models.Index(fields=["status", "-created_at", "-id"], name="durable_run_status_list")),
        remove_index("WorkflowRun", models.Index(fields=["workflow", "-created_at", "-id"],
                                                 name="durable_run_workflow_list")),
        remove_index("WorkflowRun", models.Index(fields=["-created_at", "-id"], name="durable_run_created_list")),
    ]
