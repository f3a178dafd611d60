"""The example's pages: the latest runs, and the refund approvals the logged-in user may decide."""

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

import django_durable as durable
from django_durable.views import durable_view
from django_durable import serialization
from django_durable.models import WorkflowRun


def home(request):
    runs = list(WorkflowRun.objects.all()[:20])
    for run in runs:  # values as people read them: a Decimal is "42.00", not its stored form
        run.outcome = serialization.display_text(run.result) if run.result is not None else \
            serialization.error_parts(run.error, limit=80)
    awaiting = durable.approvals_for(request.user) if request.user.is_authenticated else []
    return render(request, "orders/home.html", {"runs": runs, "awaiting": awaiting})


@require_POST
def decide(request, run_id):
    """Approve or reject a refund as the logged-in user, who must hold orders.approve_refund."""
    if not request.user.is_authenticated:
        return redirect_to_login("/", login_url="/admin/login/")
    approved = request.POST.get("decision") == "approve"
    try:
        durable.decide(run_id, "approval", request.user, approve=approved, comment=request.POST.get("comment", ""))
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
        from django.http import HttpResponseNotAllowed

        return HttpResponseNotAllowed(["POST"])
    return {"order_id": order_id}
