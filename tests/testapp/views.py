"""Durable views the tests call (tests/urls.py)."""

from django.http import HttpResponseBadRequest

from django_durable.views import durable_view


@durable_view("tests.three_steps", budget=60)
def quick(request):
    if "x" not in request.GET:
        return HttpResponseBadRequest("x is missing")
    return {"x": int(request.GET["x"])}


@durable_view("tests.block_in_b", budget=0.3)
def slow(request):
    return {"reached": request.GET["reached"], "release": request.GET["release"]}


@durable_view("tests.block_in_b", budget=0.3, html=True)
def slow_page(request):
    return {"reached": request.GET["reached"], "release": request.GET["release"]}
