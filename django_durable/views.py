"""Durable views: a Django view that starts a workflow in the request, answers with its result when
it finishes within a short budget, and otherwise answers ``202 Accepted`` with a status URL that a
front end polls (JSON) or a person watches (an HTML page that refreshes itself).

    from django_durable.views import durable_view

    @durable_view("orders.fulfil", budget=1.0)
    def checkout(request):
        return {"order_id": int(request.POST["order"])}        # the run's keyword arguments

    # urls.py
    path("durable/", include("django_durable.urls")),          # the status page and its JSON

The status URL carries a signed token of the run (django.core.signing): whoever holds it may read
that run's status and result, and nothing else; a token made for a logged-in user works for that
user only. The run is started outside any transaction (the view is ``non_atomic_requests``), so it
commits at once and workers see it even under ATOMIC_REQUESTS; a worker that dies while it runs
leaves it to the next worker, and the status URL keeps answering.
"""

from __future__ import annotations

import functools
from typing import Any

from django.core import signing
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from . import conf, serialization
from .exceptions import WaitTimeout, WorkflowFailed
from .models import WorkflowRun

_SALT = "django_durable.run-status"


def durable_view(workflow, *, budget: float = 1.0, html: bool = False, **start_options):
    """Decorate a view that returns the keyword arguments of a run of `workflow` (a dict), or an
    HttpResponse to answer without starting one (a form with errors, say).

    The run is started with `start_options` (queue, priority, idempotency_key...) and waited for
    up to `budget` seconds: finished, the answer is 200 with {"id", "status", "result"} (or with
    "error", {"type", "message"}, if it ended otherwise than completed); still running, 202 with {"id", "status", "status_url"} and a
    Location header. With `html=True` the slow answer is a redirect to the status page instead.
    """
    def decorator(view):
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args, **kwargs):
            arguments = view(request, *args, **kwargs)
            if isinstance(arguments, HttpResponse):
                return arguments
            return respond(request, workflow, kwargs=arguments or {}, budget=budget, html=html, **start_options)

        return transaction.non_atomic_requests(wrapper)

    return decorator


def respond(request: HttpRequest, workflow, *, args=(), kwargs: dict | None = None, budget: float = 1.0,
            html: bool = False, **start_options) -> HttpResponse:
    """Start `workflow` and answer as durable_view() does (for views that decide more themselves)."""
    from .services import start_run, wait

    if transaction.get_connection(conf.get("DATABASE")).in_atomic_block:
        raise RuntimeError(
            "durable.views.respond() is inside a transaction (ATOMIC_REQUESTS?): the run would not be "
            "visible to workers before the response. Decorate the view with durable_view(), or with "
            "django.db.transaction.non_atomic_requests."
        )
    run = start_run(workflow, list(args), kwargs or {}, **start_options)
    try:
        result = wait(run.pk, timeout=budget)
    except WaitTimeout:
        url = status_url(run.pk, request, page=html)
        response = HttpResponse(status=303) if html else \
            JsonResponse({"id": str(run.pk), "status": "running", "status_url": url}, status=202)
        response["Location"] = url
        return response
    except WorkflowFailed as failed:  # the request did its part: the run's outcome is the answer
        return JsonResponse({"id": str(run.pk), "status": failed.status, "error": _error(failed.error)})
    return JsonResponse({"id": str(run.pk), "status": "completed", "result": _shown(result)})


def status_url(run_id, request: HttpRequest | None = None, *, page: bool = False) -> str:
    """The URL of the run's status (JSON, or the HTML page), for the user of `request`."""
    user = getattr(request, "user", None)
    owner = str(user.pk) if user is not None and user.is_authenticated else None
    token = signing.dumps({"r": str(run_id), "u": owner}, salt=_SALT)
    return reverse("durable:run-page" if page else "durable:run-status", args=[token])


def _run_of(request, token: str) -> WorkflowRun:
    try:
        data = signing.loads(token, salt=_SALT)
    except signing.BadSignature:
        raise Http404("No such run.") from None
    user = getattr(request, "user", None)
    if data.get("u") is not None and (user is None or not user.is_authenticated or str(user.pk) != data["u"]):
        raise Http404("No such run.")
    run = WorkflowRun.objects.using(conf.get("DATABASE")).filter(pk=data["r"]).first()
    if run is None:
        raise Http404("No such run.")
    return run


def _state(run: WorkflowRun) -> dict[str, Any]:
    state = {"id": str(run.pk), "status": run.status, "finished": run.is_finished}
    progress = run.progress()
    if progress:
        state["progress"] = progress
    if run.status == WorkflowRun.Status.COMPLETED:
        state["result"] = serialization.display(run.result)
    elif run.is_finished:
        state["error"] = _error(run.get_error())
    return state


def run_status(request: HttpRequest, token: str) -> JsonResponse:
    """GET: the run's status, progress and (once it ended) its result or error, as JSON."""
    return JsonResponse(_state(_run_of(request, token)))


def run_page(request: HttpRequest, token: str) -> TemplateResponse:
    """GET: the same as a page that refreshes itself every second until the run ends."""
    run = _run_of(request, token)
    return TemplateResponse(request, "django_durable/run_status.html", {"run": run, "state": _state(run)})


def _error(error: dict | None) -> dict:
    error = error or {}
    return {"type": error.get("type", ""), "message": error.get("message", "")}


def _shown(value):
    return serialization.display(serialization.encode(value))


__all__ = ["durable_view", "respond", "run_page", "run_status", "status_url"]
