"""Example workflows, discovered automatically because this file is called workflows.py."""

import importlib.util
import time
from datetime import timedelta
from decimal import Decimal


import django_durable as durable

from .models import PRODUCTS, Order, Payment
from .tasks import send_email


def load_order(order_id):
    order = Order.objects.get(pk=order_id)
    return {"id": order.pk, "customer": order.customer, "total": order.total, "product": order.product,
            "quantity": order.quantity, "card": order.card, "status": order.status}


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
    payment = ctx.step("charge", take_payment, order, reference, atomic=True)
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
    if order["status"] != "shipped":  # nothing was paid for and sent: nobody is asked
        return {"refunded": False, "reason": f"order {order_id} is {order['status']}, not shipped"}
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
    """An order paid for and shipped some time ago: one a refund may be asked for."""
    return Order.objects.create(customer=customer, total=Decimal(total), status="shipped")


# -- the shop's checkout: a saga, with a receipt as a child workflow ------------------------------


def reserve_stock(order):
    time.sleep(0.4)  # pretend to ask the warehouse
    Order.objects.filter(pk=order["id"]).update(status="reserved")
    return {"reservation": f"RES-{order['id']:05d}"}


def release_stock(reservation):
    """The compensation of reserve_stock: give the items back."""
    order_id = int(reservation["reservation"].removeprefix("RES-"))
    Order.objects.filter(pk=order_id).update(status="cancelled")


def take_payment(order, reference):
    """An atomic step (atomic=True): the Payment row commits with the step's checkpoint, or neither
    does, so a crash can never charge twice in our database."""
    time.sleep(0.4)  # pretend to talk to the payment provider
    if order["card"] == "declined":
        raise durable.NonRetryableError("The card was declined.")
    payment = Payment.objects.create(order_id=order["id"], amount=order["total"], reference=reference)
    Order.objects.filter(pk=order["id"]).update(status="paid")
    return {"payment_id": payment.pk, "amount": payment.amount}


def refund_payment(payment):
    """The compensation of take_payment."""
    Payment.objects.filter(pk=payment["payment_id"]).delete()


def dispatch(order):
    time.sleep(0.4)  # pretend to print a label
    Order.objects.filter(pk=order["id"]).update(status="shipped")
    return {"tracking": f"TRACK-{order['id']:05d}"}


@durable.workflow("orders.checkout", compensate_on_failure=True)
def checkout(ctx: durable.Context, order_id: int) -> dict:
    """Reserve, charge, ship, then a receipt. A failure after the reservation undoes what was done,
    newest first (a saga): a declined card releases the stock."""
    order = ctx.step("load", load_order, order_id)
    ctx.set_progress(0, 4, "Reserving your items")
    ctx.step("reserve", reserve_stock, order, compensate=release_stock)
    ctx.set_progress(1, 4, "Taking the payment")
    payment = ctx.step("charge", take_payment, order, str(ctx.uuid()), atomic=True, compensate=refund_payment)
    ctx.set_progress(2, 4, "Shipping")
    shipment = ctx.step("ship", dispatch, order)
    ctx.set_progress(3, 4, "Sending the receipt")
    receipt = ctx.child("receipt", "orders.receipt", order_id)
    ctx.set_progress(4, 4, "Done")
    return {"order": order_id, "paid": payment["amount"], "tracking": shipment["tracking"], "receipt": receipt}


def write_receipt(order):
    name = PRODUCTS[order["product"]][0] if order["product"] in PRODUCTS else "items"
    return (f"Dear {order['customer']},\n\nthank you for your order {order['id']}: {order['quantity']} x {name}, "
            f"{order['total']} paid.\n")


def enqueue_email(order, body):
    """Hand the e-mail to a django.tasks task (one more durable run, retried on its own)."""
    result = send_email.enqueue(order["id"], f"{order['customer'].lower()}@example.com",
                                f"Your receipt for order {order['id']}", body)
    return {"task": str(result.id)}


@durable.workflow("orders.receipt")
def receipt(ctx: durable.Context, order_id: int) -> dict:
    """A child of orders.checkout: its own run, journal and retries."""
    order = ctx.step("load", load_order, order_id)
    body = ctx.step("write", write_receipt, order)
    return ctx.step("send", enqueue_email, order, body)


# -- product images: a fan-out ---------------------------------------------------------------------


def render_image(job):
    """Pretend to resize one product photo."""
    time.sleep(0.3)
    return {"sku": job["sku"], "size": job["size"], "file": f"{job['sku']}-{job['size']}.webp"}


@durable.workflow("catalog.render_images")
def render_images(ctx: durable.Context, sizes: list[int]) -> dict:
    """One branch per product and size, run by any worker in parallel; the run waits for all."""
    jobs = [{"sku": sku, "size": size} for sku in sorted(PRODUCTS) for size in sizes]
    files = ctx.map("render", render_image, jobs)
    return {"rendered": len(files), "files": [f["file"] for f in files]}


def count_orders():
    return {status: Order.objects.filter(status=status).count() for status in ("new", "paid", "shipped", "refunded")}


@durable.workflow("orders.nightly_report", schedule="0 2 * * *")
def nightly_report(ctx: durable.Context) -> dict:
    """A declared schedule: every night at 02:00 UTC (synced by every worker at start-up)."""
    return ctx.step("count", count_orders)


if importlib.util.find_spec("pydantic_ai") is not None:  # the support agent, with the extra installed
    from . import support  # noqa: E402,F401 - registers orders.support
