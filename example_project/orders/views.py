"""The example shop's pages: place an order and watch its checkout live, ask for a refund that a
person approves, render product images, and see the latest runs.

The order page follows its run through the run's live events (`GET
/api/durable/workflows/<id>/stream/`, server-sent, read with an EventSource) with a few lines of
JavaScript in the template: no build step. The API answers staff users, so the shop asks visitors
to log in (demo / demo in `make demo`).
"""

from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponseNotAllowed
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

import django_durable as durable
from django_durable import registry, serialization
from django_durable.models import Schedule, WorkflowRun
from django_durable.views import durable_view

from .models import PRODUCTS, Order, SentEmail

LOGIN_URL = "/admin/login/"
IMAGE_SIZES = [160, 640, 1280]


def home(request):
    runs = list(WorkflowRun.objects.all()[:20])
    for run in runs:  # values as people read them: a Decimal is "42.00", not its stored form
        run.outcome = serialization.display_text(run.result) if run.result is not None else \
            serialization.error_parts(run.error, limit=80)
    awaiting = durable.approvals_for(request.user) if request.user.is_authenticated else []
    return render(request, "orders/home.html", {
        "runs": runs, "awaiting": awaiting, "products": PRODUCTS, "sizes": IMAGE_SIZES,
        "orders": Order.objects.order_by("-pk")[:10],
        "report": Schedule.objects.filter(workflow="orders.nightly_report").first(),
    })


@require_POST
@login_required(login_url=LOGIN_URL)
def place_order(request):
    """Create the order and start its checkout, which commits with it (one transaction)."""
    sku = request.POST.get("product")
    if sku not in PRODUCTS:
        messages.error(request, "Choose a product.")
        return redirect("home")
    try:
        quantity = max(1, min(10, int(request.POST.get("quantity", 1))))
    except ValueError:
        quantity = 1
    card = "declined" if request.POST.get("card") == "declined" else "ok"
    with transaction.atomic():
        order = Order.objects.create(customer=request.POST.get("customer", "").strip()[:100] or request.user.username,
                                     product=sku, quantity=quantity, card=card,
                                     total=Decimal(PRODUCTS[sku][1]) * quantity)
        durable.start("orders.checkout", order_id=order.pk, subject=order)
    return redirect("order", order_id=order.pk)


@login_required(login_url=LOGIN_URL)
def order(request, order_id):
    order = get_object_or_404(Order, pk=order_id)
    runs = list(durable.runs_for(order))
    checkout = next((run for run in runs if run.workflow == "orders.checkout"), None)
    return render(request, "orders/order.html", {
        "order": order, "product": PRODUCTS.get(order.product, (order.product, "")), "runs": runs,
        "checkout": checkout, "emails": SentEmail.objects.filter(order=order).order_by("-pk"),
        "refund_started": any(run.workflow == "orders.approve_refund" for run in runs),
        "tickets": [run for run in runs if run.workflow == "orders.support"],
        "support": registry.find("orders.support") is not None,
    })


@require_POST
@login_required(login_url=LOGIN_URL)
def ask_refund(request, order_id):
    """Start the refund workflow: it waits until a person allowed to approve refunds decides."""
    order = get_object_or_404(Order, pk=order_id)
    if order.status != "shipped":
        messages.warning(request, "Only a shipped order can be refunded.")
    else:
        durable.start("orders.approve_refund", order_id=order.pk, amount=str(order.total), subject=order,
                      idempotency_key=f"refund:{order.pk}")
        messages.success(request, "Refund requested: it waits for approval (see the home page or the admin's inbox).")
    return redirect("order", order_id=order.pk)


@require_POST
@login_required(login_url=LOGIN_URL)
def render_images(request):
    run = durable.start("catalog.render_images", sizes=IMAGE_SIZES)
    messages.success(request, f"Rendering {len(PRODUCTS) * len(IMAGE_SIZES)} images in parallel: run {run.short_id}.")
    return redirect(f"/admin/django_durable/workflowrun/{run.pk}/change/")


@require_POST
@login_required(login_url=LOGIN_URL)
def ask_support(request, order_id):
    """Start the support agent on the customer's question; its ticket page follows the answer."""
    order = get_object_or_404(Order, pk=order_id)
    question = request.POST.get("question", "").strip()[:1000]
    if not question:
        messages.error(request, "Write your question.")
        return redirect("order", order_id=order.pk)
    run = durable.start("orders.support", order_id=order.pk, question=question, subject=order)
    return redirect("ticket", order_id=order.pk, run_id=run.pk)


@login_required(login_url=LOGIN_URL)
def ticket(request, order_id, run_id):
    """A support ticket: the question, and the agent's answer as it is written (the run's stream)."""
    run = get_object_or_404(WorkflowRun, pk=run_id, workflow="orders.support")
    question = run.get_input()["kwargs"].get("question", "")
    return render(request, "orders/ticket.html", {"order": get_object_or_404(Order, pk=order_id), "run": run,
                                                  "question": question})


@require_POST
def decide(request, run_id):
    """Approve or reject a refund as the logged-in user, who must hold orders.approve_refund (the
    refund workflow's approval, or the support agent's call of its refund tool: the form's key)."""
    if not request.user.is_authenticated:
        return redirect_to_login("/", login_url=LOGIN_URL)
    approved = request.POST.get("decision") == "approve"
    try:
        durable.decide(run_id, request.POST.get("key", "approval"), request.user, approve=approved,
                       comment=request.POST.get("comment", ""))
    except PermissionDenied:
        messages.error(request, "You may not approve refunds.")
    except LookupError:
        raise Http404("No refund waits for a decision there.") from None
    except durable.DurableError as refused:
        messages.warning(request, str(refused))
    else:
        messages.success(request, f"Refund {'approved' if approved else 'rejected'}.")
    return redirect("home")


@durable_view("orders.fulfil", budget=2.0)
def fulfil(request, order_id):
    """POST: fulfil the order; the result within two seconds, else 202 and a status URL to poll."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    return {"order_id": order_id}
