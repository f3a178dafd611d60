"""Example workflows, discovered automatically because this file is called workflows.py."""

import time
from datetime import timedelta
from decimal import Decimal


import django_durable as durable

from .models import Order, Payment


def load_order(order_id):
    order = Order.objects.get(pk=order_id)
    return {"id": order.pk, "customer": order.customer, "total": order.total}


def charge(order, reference):
    # Runs in the same transaction as its checkpoint (atomic=True): the Payment row and the
    # recorded step commit together, so a crash can never charge twice in our database.
    payment = Payment.objects.create(order_id=order["id"], amount=order["total"], reference=reference)
    Order.objects.filter(pk=order["id"]).update(status="paid")
    return {"payment_id": payment.pk, "amount": payment.amount}


def pack(order):
    time.sleep(0.5)  # pretend to talk to the warehouse
    return {"parcel": f"PARCEL-{order['id']:05d}"}


def ship(order, parcel):
    Order.objects.filter(pk=order["id"]).update(status="shipped")
    return {"tracking": f"TRACK-{parcel['parcel']}"}


@durable.workflow("orders.fulfil")
def fulfil(ctx: durable.Context, order_id: int) -> dict:
    order = ctx.step("load", load_order, order_id)
    reference = str(ctx.uuid())
    payment = ctx.step("charge", charge, order, reference, atomic=True)
    parcel = ctx.step("pack", pack, order)
    shipment = ctx.step("ship", ship, order, parcel)
    return {"order": order["id"], "paid": payment["amount"], "tracking": shipment["tracking"]}


def count_words(text):
    return len(text.split())


@durable.workflow("examples.word_count")
def word_count(ctx: durable.Context, texts: list[str]) -> int:
    total = 0
    for i, text in enumerate(texts):
        total += ctx.step(f"count:{i}", count_words, text)
    return total


def flaky(order_id):
    # NonRetryableError: no point in trying again; other errors are retried with back-off.
    raise durable.NonRetryableError(f"The label printer is out of paper (order {order_id}).")


@durable.workflow("examples.failing")
def failing(ctx: durable.Context, order_id: int) -> None:
    ctx.step("print-label", flaky, order_id)


def refund(order_id, amount):
    Order.objects.filter(pk=order_id).update(status="refunded")
    return {"order": order_id, "refunded": amount}


@durable.workflow("orders.approve_refund")
def approve_refund(ctx: durable.Context, order_id: int, amount: str) -> dict:
    """Wait for a person allowed to approve refunds to decide (the RFC's "wait for user confirmation")."""
    order = ctx.step("load", load_order, order_id)
    try:
        decision = ctx.wait_for_approval(
            "approval", approvers="orders.approve_refund", timeout=timedelta(days=2),
            message=f"Refund {amount} to {order['customer']} (order {order_id})?",
            data={"order": order_id, "customer": order["customer"], "amount": amount},
        )
    except durable.ApprovalTimeout:
        return {"refunded": False, "reason": "nobody decided within two days"}
    if not decision["approved"]:
        return {"refunded": False, "reason": f"rejected by {', '.join(decision['by'])}"}
    ctx.step("refund", refund, order_id, amount, atomic=True)
    return {"refunded": True, "approved_by": decision["by"]}


def create_demo_order(customer: str, total: str) -> Order:
    return Order.objects.create(customer=customer, total=Decimal(total))




def count_orders():
    return {status: Order.objects.filter(status=status).count() for status in ("new", "paid", "shipped", "refunded")}


@durable.workflow("orders.nightly_report", schedule="0 2 * * *")
def nightly_report(ctx: durable.Context) -> dict:
    """A declared schedule: every night at 02:00 UTC (synced by every worker at start-up)."""
    return ctx.step("count", count_orders)
