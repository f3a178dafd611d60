"""The example's pages: the latest runs, and the decision a refund approval waits for."""

from django.contrib import messages
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

import django_durable as durable
from django_durable import serialization
from django_durable.models import WorkflowRun


def home(request):
    runs = list(WorkflowRun.objects.all()[:20])
    for run in runs:  # values as people read them: a Decimal is "42.00", not its stored form
        run.outcome = serialization.display_text(run.result) if run.result is not None else \
            serialization.error_parts(run.error, limit=80)
    awaiting = WorkflowRun.objects.filter(workflow="orders.approve_refund", status="waiting")[:10]
    return render(request, "orders/home.html", {"runs": runs, "awaiting": awaiting})


@require_POST
def decide(request, run_id):
    approved = request.POST.get("decision") == "approve"
    who = request.user.get_username() if request.user.is_authenticated else "a visitor"
    try:
        durable.signal(run_id, "decision", {"approved": approved, "by": who})
    except durable.WorkflowNotFound:
        raise Http404("No such run.") from None
    except durable.RunFinished as finished:
        messages.warning(request, f"That run already ended {finished.status}.")
    else:
        messages.success(request, f"Refund {'approved' if approved else 'rejected'}.")
    return redirect("home")
