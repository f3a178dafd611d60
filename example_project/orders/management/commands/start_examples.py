"""manage.py start_examples: create a few orders and start the example workflows on them."""

from django.core.management.base import BaseCommand

import django_durable as durable
from example_project.orders.workflows import create_demo_order


class Command(BaseCommand):
    help = "Start a few example workflow runs."

    def handle(self, *args, **options):
        runs = []
        for customer, total in [("Ada", "42.00"), ("Grace", "17.50"), ("Linus", "99.90")]:
            order = create_demo_order(customer, total)
            runs.append(durable.start("orders.fulfil", order_id=order.pk, subject=order))
        runs.append(durable.start("examples.word_count", ["durable workflows", "for Django", "in your own database"]))
        runs.append(durable.start("examples.failing", order_id=0))
        order = create_demo_order("Margaret", "23.00")
        runs.append(durable.start("orders.approve_refund", order_id=order.pk, amount="23.00", subject=order))
        for run in runs:
            self.stdout.write(f"started {run.workflow:<22} {run.id}")
