"""manage.py start_examples: create a few orders and start the example workflows on them (one card
is declined: its checkout is undone)."""

from decimal import Decimal

from django.core.management.base import BaseCommand

import django_durable as durable
from example_project.orders.models import PRODUCTS, Order
from example_project.orders.workflows import create_demo_order


class Command(BaseCommand):
    help = "Start a few example workflow runs."

    def handle(self, *args, **options):
        runs = []
        for customer, sku, card in [("Ada", "mug", "ok"), ("Grace", "tee", "ok"), ("Linus", "poster", "declined")]:
            order = Order.objects.create(customer=customer, product=sku, card=card, total=Decimal(PRODUCTS[sku][1]))
            runs.append(durable.start("orders.checkout", order_id=order.pk, subject=order))
        runs.append(durable.start("examples.word_count", ["durable workflows", "for Django", "in your own database"]))
        runs.append(durable.start("examples.failing", order_id=0))
        order = create_demo_order("Margaret", "23.00")
        runs.append(durable.start("orders.approve_refund", order_id=order.pk, amount="23.00", subject=order))
        for run in runs:
            self.stdout.write(f"started {run.workflow:<22} {run.id}")
