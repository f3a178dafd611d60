"""The example's home page: the latest runs and where to look at them."""

from django.shortcuts import render

from django_durable.models import WorkflowRun


def home(request):
    runs = WorkflowRun.objects.all()[:20]
    return render(request, "orders/home.html", {"runs": runs})
