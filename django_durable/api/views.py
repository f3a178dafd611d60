"""The API's views: runs (list, start, status, cancel, signal, result, retry), events and schedules."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import time
import uuid

from django.db import connections
from django.db.models import DateTimeField, Q, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils.dateparse import parse_datetime
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework import exceptions, status, viewsets
from rest_framework.decorators import action
from rest_framework.pagination import BasePagination
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from .. import catalog, conf, schedules, services
from ..exceptions import InvalidArguments, StepNotFound
from ..models import Schedule, Step, WorkflowRun
from . import errors
from .access import ActionPermission, DurableThrottle, can_see_payloads, configured_permissions, scoped
from .serializers import (
    ApprovalSerializer,
    DecideSerializer,
    DefinitionSerializer,
    DescribeSerializer,
    ErrorBodySerializer,
    EventSentSerializer,
    EventSerializer,
    ForkSerializer,
    QueueLimitsSerializer,
    QueuePauseSerializer,
    QueueStateSerializer,
    RepairPlanSerializer,
    RepairSerializer,
    RunSerializer,
    RunSummarySerializer,
    ScheduleSerializer,
    ShapeSerializer,
    SignalSentSerializer,
    SignalSerializer,
    UpdateAnswerSerializer,
    UpdateSerializer,
    StartSerializer,
)

UUID = r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
ERRORS = {code: OpenApiResponse(ErrorBodySerializer, description=text) for code, text in {
    400: "invalid input (error.code: invalid, invalid_json, unknown_field, unknown_workflow, invalid_arguments, invalid_input, invalid_payload)",
    401: "not authenticated", 403: "not permitted", 404: "no such run, or one this user may not see",
    409: "the run's state refuses it (run_finished, invalid_transition), or a singleton's run is unfinished (busy)", 413: "payload too large",
    429: "throttled",
}.items()}


def document(**kwargs):
    """extend_schema() on drf-spectacular's AutoSchema, whatever the project's DEFAULT_SCHEMA_CLASS."""

    def decorator(function):
        function.kwargs = {**getattr(function, "kwargs", {}), "schema": AutoSchema}
        return extend_schema(**kwargs)(function)

    return decorator


def errors_for(*codes: int) -> dict:
    return {code: ERRORS[code] for code in (400, 401, 403, *codes)}


class DurableView:
    """What every durable API view shares: security by default, JSON errors, bounded bodies."""

    schema = AutoSchema()
    parser_classes = [errors.SafeJSONParser]
    renderer_classes = [errors.SafeJSONRenderer]
    required_permissions: dict[str, str] = {}
    throttle_scopes: dict[str, str] = {}

    def get_permissions(self):
        return [*configured_permissions(), ActionPermission()]

    def get_throttles(self):
        scope = self.throttle_scopes.get(getattr(self, "action", None) or "")
        return [DurableThrottle(scope)] if scope else []

    def get_exception_handler(self):
        return errors.handle

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        errors.check_body_size(request)  # after authentication: strangers learn nothing
        errors.check_text(request, kwargs)

    def get_authenticate_header(self, request):
        """The first challenge any of the project's authenticators offers (DRF asks only the first,
        and a session offers none): with DRF's defaults a stranger gets 401 and `WWW-Authenticate:
        Basic`, not 403. With no authenticator that has one, 403 as before."""
        for authenticator in request.authenticators:
            header = authenticator.authenticate_header(request)
            if header:
                return header
        return None

    def by(self) -> str:
        return self.request.user.get_username()


class RunPages(BasePagination):
    """Keyset pages, newest first: the cursor is the last run's (created_at, id), so a page costs
    one index range however deep it is, and runs created meanwhile never shift a page."""

    page_size = 50
    max_page_size = 500

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        size = request.query_params.get("page_size", str(self.page_size))
        if not size.isdigit() or not 0 < int(size) <= self.max_page_size:
            raise exceptions.ValidationError({"page_size": [f"Give a number from 1 to {self.max_page_size}."]})
        size = int(size)
        queryset = queryset.order_by("-created_at", "-id")
        cursor = request.query_params.get("cursor")
        if cursor:
            created_at, pk = self._decode(cursor)
            # The anchor's time as the database holds it (SQLite keeps text, at its own precision);
            # the cursor's copy stands in if that run was deleted since.
            anchor = Coalesce(Subquery(WorkflowRun.objects.filter(pk=pk).values("created_at")[:1]),
                              Value(created_at, output_field=DateTimeField()))
            queryset = queryset.filter(Q(created_at__lt=anchor) | Q(created_at=anchor, id__lt=pk))
        page = list(queryset[: size + 1])
        self.more = len(page) > size
        self.page = page[:size]
        return self.page

    def get_paginated_response(self, data):
        return Response({"next": self._next_link(), "results": data})

    def _next_link(self):
        if not self.more:
            return None
        last = self.page[-1]
        token = base64.urlsafe_b64encode(f"{last.created_at.isoformat()}|{last.pk}".encode()).decode()
        return replace_query_param(self.request.build_absolute_uri(), "cursor", token)

    def _decode(self, cursor: str):
        try:
            created_at, pk = base64.urlsafe_b64decode(cursor.encode()).decode().split("|")
            return _utc(created_at), uuid.UUID(pk)
        except (ValueError, UnicodeError, binascii.Error):
            raise exceptions.ValidationError({"cursor": ["This cursor is not valid."]}) from None

    def get_paginated_response_schema(self, schema):
        return {"type": "object", "required": ["results"], "properties": {
            "next": {"type": "string", "nullable": True, "format": "uri", "description": "the next page, if any"},
            "results": schema,
        }}

    def get_schema_operation_parameters(self, view):
        return [
            {"name": "cursor", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "From the `next` link of the page before."},
            {"name": "page_size", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": self.max_page_size}},
        ]


LIST_FILTERS = [
    OpenApiParameter("status", OpenApiTypes.STR, description="One status, or several separated by commas."),
    OpenApiParameter("workflow", OpenApiTypes.STR),
    OpenApiParameter("queue", OpenApiTypes.STR),
    OpenApiParameter("kind", OpenApiTypes.STR, enum=["workflow", "task"],
                     description="Workflows, or django.tasks tasks (django_durable.tasks.DurableBackend)."),
    OpenApiParameter("waiting_for", OpenApiTypes.STR, enum=list(WorkflowRun.WAITING_FOR),
                     description="Unfinished runs in this kind of wait."),
    OpenApiParameter("created_after", OpenApiTypes.DATETIME),
    OpenApiParameter("created_before", OpenApiTypes.DATETIME),
]


class WorkflowRunViewSet(DurableView, viewsets.GenericViewSet):
    """Workflow runs. Override get_queryset() (or set DURABLE_API_QUERYSET_FILTER) to scope them."""

    lookup_value_regex = UUID
    pagination_class = RunPages
    serializer_class = RunSerializer
    required_permissions = {
        "list": "view_workflowrun", "retrieve": "view_workflowrun", "result": "view_workflowrun",
        "create": "start_workflowrun", "destroy": "cancel_workflowrun", "signal": "signal_workflowrun",
        "retry": "retry_workflowrun", "fork": "start_workflowrun", "send_update": "signal_workflowrun",
        "update_answer": "view_workflowrun", "stream": "view_workflowrun",
        "repair": "view_workflowrun",  # and the repair's own permission, checked in repair()
    }
    throttle_scopes = {"create": "start", "fork": "start", "repair": "start", "signal": "signal", "send_update": "signal", "destroy": "cancel"}

    def handle_exception(self, exc):
        if getattr(self, "action", None) == "stream":  # an error is JSON, whatever an EventSource accepts
            self.request.accepted_renderer = errors.SafeJSONRenderer()
            self.request.accepted_media_type = "application/json"
        return super().handle_exception(exc)

    def get_queryset(self):
        return scoped(self.request, WorkflowRun.objects.using(conf.get("DATABASE")).all())

    def get_object(self):
        """The run of the URL; a 404 names the id, as a malformed one's does (a run out of the
        caller's scope answers the same: it is not theirs to know of)."""
        from django.http import Http404

        try:
            return super().get_object()
        except Http404:
            raise exceptions.NotFound(f"No workflow run has the id {self.kwargs.get(self.lookup_field, '')}.") from None

    def represent(self, run, code=status.HTTP_200_OK, *, include_steps=False) -> Response:
        context = {"payloads": can_see_payloads(self.request), "include_steps": include_steps}
        return Response(RunSerializer(run, context=context).data, status=code)

    @document(parameters=LIST_FILTERS, responses={200: RunSummarySerializer(many=True), **errors_for(400)})
    def list(self, request):
        """Runs, newest first, a page at a time (follow `next`)."""
        runs = self.get_queryset().defer("input", "result", "error")
        params = request.query_params
        if params.get("status"):
            try:
                runs = runs.filter(status__in=WorkflowRun.statuses_from(params["status"]))
            except ValueError as exc:
                raise exceptions.ValidationError({"status": [str(exc)]}) from None
        for field in ("workflow", "queue"):
            if params.get(field):
                runs = runs.filter(**{field: params[field]})
        if params.get("kind"):
            try:
                runs = runs.of_kind(params["kind"])
            except ValueError as exc:
                raise exceptions.ValidationError({"kind": [str(exc)]}) from None
        if params.get("waiting_for"):
            try:
                runs = runs.waiting_for(params["waiting_for"])
            except ValueError as exc:
                raise exceptions.ValidationError({"waiting_for": [str(exc)]}) from None
        for name, lookup in (("created_after", "created_at__gte"), ("created_before", "created_at__lt")):
            if params.get(name):
                when = _datetime(params[name], name)
                runs = runs.filter(**{lookup: when})
        page = self.paginate_queryset(runs)
        return self.get_paginated_response(RunSummarySerializer(page, many=True).data)

    @document(request=StartSerializer, examples=[OpenApiExample(
        "start", request_only=True,
        value={"workflow": "orders.fulfil", "kwargs": {"order_id": 42}, "idempotency_key": "order-42"})],
        responses={201: RunSerializer, 200: RunSerializer, **errors_for(400, 409, 413, 429)})
    def create(self, request):
        """Start a run. With an idempotency key already used for this workflow, a singleton key whose run is
        unfinished, or a debounce key whose run waits for quiet: 200 and that run."""
        data = _valid(StartSerializer, request)
        run = services.start_run(
            data["workflow"], data["args"], data["kwargs"], idempotency_key=data.get("idempotency_key"),
            run_at=data.get("run_at"), delay=data.get("delay"), queue=data.get("queue"),
            priority=data.get("priority"), concurrency_key=data.get("concurrency_key"), by=self.by(),
            singleton=data.get("singleton"), debounce=data.get("debounce"), throttle=data.get("throttle"),
        )
        created = getattr(run, "created_now", True)
        return self.represent(services.warn_if_unserved(run), status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @document(parameters=[OpenApiParameter("include", OpenApiTypes.STR, enum=["steps"],
                                                description="steps: the whole journal (up to 1,000 entries)")],
                   responses={200: RunSerializer, **errors_for(404)})
    def retrieve(self, request, pk=None):
        """A run's status, what it waits on, its result or error, its times and a summary of its steps."""
        return self.represent(self.get_object(), include_steps=request.query_params.get("include") == "steps")

    @document(parameters=[OpenApiParameter("reason", OpenApiTypes.STR)],
                   responses={202: RunSerializer, **errors_for(404, 409, 429)})
    def destroy(self, request, pk=None):
        """Cancel the run (and its unfinished children), the reason as ?reason= or a JSON body's
        "reason". Again on a cancelled run: 202. A run that ended otherwise: 409."""
        run = self.get_object()
        body = request.data if isinstance(request.data, dict) else {}
        unknown = sorted(set(body) - {"reason"})
        if unknown or not isinstance(body.get("reason", ""), str):
            raise exceptions.ValidationError({"reason": [
                f"A cancel takes only a reason, a string, as ?reason= or in a JSON body; not {', '.join(unknown) or 'that'}."]})
        reason = (request.query_params.get("reason") or body.get("reason") or "")[:500] or None
        return self.represent(services.cancel(run.pk, reason, by=self.by()), status.HTTP_202_ACCEPTED)

    @document(request=SignalSerializer, examples=[OpenApiExample(
        "signal", request_only=True, description="The signal's value goes under payload; other keys are refused.",
        value={"payload": {"approved": False, "by": "alice"}, "idempotency_key": "approval-7"})],
        responses={202: SignalSentSerializer, **errors_for(400, 404, 409, 413, 429)})
    @action(detail=True, methods=["post"], url_path=r"signals/(?P<name>[^/]{1,200})")
    def signal(self, request, pk=None, name=None):
        """Send the signal `name` (for ctx.wait_for_signal) with a JSON payload."""
        run = self.get_object()
        data = _valid(SignalSerializer, request)
        message = services.signal(run.pk, name, data.get("payload"), idempotency_key=data.get("idempotency_key"),
                                  by=self.by())
        sent = {"id": message.pk, "run": run.pk, "name": message.name, "created_at": message.created_at,
                "warning": catalog.unawaited_signal(run.workflow, name)}
        return Response(SignalSentSerializer(sent).data, status=status.HTTP_202_ACCEPTED)

    @document(parameters=[OpenApiParameter("wait", OpenApiTypes.NUMBER,
                                                description="Seconds to wait for the run to finish (capped by DURABLE_API_MAX_WAIT).")],
                   responses={200: RunSerializer, 202: RunSerializer, **errors_for(400, 404)})
    @action(detail=True, methods=["get"])
    def result(self, request, pk=None):
        """The run once it has finished (200), or as it is when `wait` runs out (202).

        While it waits the request holds no database connection: it reconnects to look again.
        """
        run = self.get_object()
        wait = _seconds(request.query_params.get("wait", "0"))
        deadline = time.monotonic() + min(wait, float(conf.get("API_MAX_WAIT")))
        delay = 0.05
        while not run.is_finished and time.monotonic() < deadline:
            _release_connection()
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 1.0)
            run.refresh_from_db()
        return self.represent(services.warn_if_unserved(run),
                              status.HTTP_200_OK if run.is_finished else status.HTTP_202_ACCEPTED)

    @document(request=None, responses={202: RunSerializer, **errors_for(404, 409)})
    @action(detail=True, methods=["post"])
    def retry(self, request, pk=None):
        """Run a failed, timed-out or cancelled run again from its last checkpoint, or resume a blocked or paused one."""
        run = self.get_object()
        return self.represent(services.retry_run(run.pk, by=self.by()), status.HTTP_202_ACCEPTED)


    @document(parameters=[OpenApiParameter("Last-Event-ID", OpenApiTypes.INT, location=OpenApiParameter.HEADER,
                                           description="Go on after this event id (a reconnect).")],
              responses={(200, "text/event-stream"): OpenApiTypes.OBJECT, **errors_for(400, 404)})
    @action(detail=True, methods=["get"], renderer_classes=[errors.SafeJSONRenderer, errors.EventStreamRenderer])
    def stream(self, request, pk=None):
        """The run's live events, server-sent (text/event-stream): status, step, note, emit, stream
        and end, until it ends (services/streams.py). The same permissions as the run's detail."""
        from django.core.handlers.asgi import ASGIRequest
        from django.http import StreamingHttpResponse

        from ..services import streams

        run = self.get_object()
        try:
            after = max(0, int(request.headers.get("Last-Event-ID") or request.query_params.get("after") or 0))
        except ValueError:
            raise exceptions.ValidationError({"Last-Event-ID": ["An event id is a whole number."]}) from None
        # Served by an ASGI server, an async iterator waiting on the event loop; by WSGI, a generator.
        follow = streams.aevents if isinstance(request._request, ASGIRequest) else streams.events
        frames = follow(run.pk, payloads=can_see_payloads(request), after=after,
                        max_seconds=float(conf.get("STREAM_MAX_SECONDS")))
        response = StreamingHttpResponse(frames, content_type="text/event-stream")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass each event on at once
        return response

    @document(request=UpdateSerializer, responses={200: UpdateAnswerSerializer, 202: UpdateAnswerSerializer,
                                                   **errors_for(400, 404, 409, 413, 429)})
    @action(detail=True, methods=["post"], url_path=r"updates/(?P<name>[^/]{1,190})")
    def send_update(self, request, pk=None, name=None):
        """Ask the run (ctx.wait_for_update(name)) and wait for its answer: 200 with it, 202 with the
        update's id while it has not answered within `wait` (it stays queued), 409 if the workflow
        refused it (code update_rejected) or the run ended without answering."""
        from ..services import updates

        run = self.get_object()
        data = _valid(UpdateSerializer, request)
        update_id = updates.send(run.pk, name, data.get("payload"), by=self.by())
        return self._answer(run, update_id, name, data.get("wait"))

    @document(parameters=[OpenApiParameter("wait", OpenApiTypes.NUMBER, description=(
        "Seconds to wait for the answer (capped by DURABLE_API_MAX_WAIT); 0 by default."))],
        responses={200: UpdateAnswerSerializer, 202: UpdateAnswerSerializer, **errors_for(400, 404, 409)})
    @action(detail=True, methods=["get"], url_path=r"updates/(?P<name>[^/]{1,190})/(?P<update_id>[0-9a-f-]{36})")
    def update_answer(self, request, pk=None, name=None, update_id=None):
        """The answer to an update sent before (its id from the 202), waiting up to `wait` seconds."""
        run = self.get_object()
        return self._answer(run, update_id, name, _seconds(request.query_params.get("wait", "0")))

    def _answer(self, run, update_id: str, name: str, wait: float | None) -> Response:
        from ..exceptions import UpdateRejected, WaitTimeout
        from ..services import updates

        limit = float(conf.get("API_MAX_WAIT"))
        try:
            answer = updates.answer_of(run.pk, update_id, timeout=limit if wait is None else min(wait, limit), name=name)
        except WaitTimeout:
            return Response(UpdateAnswerSerializer({"id": update_id, "status": "waiting", "answer": None}).data,
                            status=status.HTTP_202_ACCEPTED)
        except UpdateRejected as exc:
            raise errors.Conflict(str(exc), code="update_rejected") from None
        return Response(UpdateAnswerSerializer({"id": update_id, "status": "answered", "answer": answer}).data)

    @document(request=RepairSerializer, responses={200: RepairPlanSerializer, 202: RepairPlanSerializer,
                                                   **errors_for(400, 403)})
    @action(detail=False, methods=["post"])
    def repair(self, request):
        """Retry, rerun from a step, cancel or force-fail every run matching a filter. With dry_run
        (the default): 200 and what it would change (counts and a sample), nothing changed. Without:
        202 and the same, with the id of the durable.repair run that applies it in batches, each run
        audited with who asked. Needs the repair's own permission (as on one run); refused where
        DURABLE_API_QUERYSET_FILTER scopes the runs, since a repair reaches every run it matches."""
        from ..services import repairs

        data = _valid(RepairSerializer, request)
        repair = repairs.REPAIRS[data["repair"]]
        if not request.user.has_perm(f"django_durable.{repair.permission}"):
            raise exceptions.PermissionDenied(f"This needs the permission django_durable.{repair.permission}, "
                                              f"which you do not have.")
        if conf.get("API_QUERYSET_FILTER") is not None:
            raise exceptions.PermissionDenied("Repairs by filter reach every run they match, and this API scopes "
                                              "the runs each user sees (DURABLE_API_QUERYSET_FILTER): use the "
                                              "admin or the command line.")
        try:
            run_filter = repairs.RunFilter.parse(data["filter"])
            if data["dry_run"]:
                return Response(repairs.plan(data["repair"], run_filter, from_step=data["from_step"]).as_data())
            run, planned = repairs.start(data["repair"], run_filter, by=self.by(), reason=data["reason"],
                                         from_step=data["from_step"], batch=data["batch"])
        except InvalidArguments as exc:
            raise exceptions.ValidationError({f"filter.{exc.argument}" if exc.argument and exc.argument != "from_step"
                                              else exc.argument or "filter": [str(exc)]}) from None
        return Response({**planned.as_data(), "run": str(run.pk)}, status=status.HTTP_202_ACCEPTED)

    @document(request=ForkSerializer, responses={201: RunSerializer, **errors_for(400, 404, 409)})
    @action(detail=True, methods=["post"])
    def fork(self, request, pk=None):
        """Start a new run of this run's workflow and input from one of its steps (durable.fork()):
        the journal before the step is copied, not run again; the step and the rest run on the code
        installed now. 409 where the copy would be unsafe (a branch of a fan-out, a fan-out or child
        still running before it), with the reason."""
        run = self.get_object()
        data = _valid(ForkSerializer, request)
        try:
            fork = services.fork(run.pk, from_step=data["from_step"], by=self.by())
        except StepNotFound as exc:
            raise exceptions.ValidationError({"from_step": [str(exc)]}, code="unknown_step") from None
        return self.represent(fork, status.HTTP_201_CREATED)


class DefinitionViewSet(DurableView, viewsets.ViewSet):
    """The registered workflows and durable tasks, with their shapes (durable.workflows())."""

    lookup_field = "name"
    lookup_value_regex = r"[^/]{1,200}"
    required_permissions = {"list": "view_workflowrun", "retrieve": "view_workflowrun", "describe": "view_workflowrun"}

    @document(responses={200: DefinitionSerializer(many=True), **errors_for()})
    def list(self, request):
        """Every registered workflow and durable task, by name."""
        from ..catalog import workflows

        return Response(DefinitionSerializer(workflows(), many=True).data)

    @document(responses={200: DefinitionSerializer, **errors_for(404)})
    def retrieve(self, request, name=None):
        """One registered workflow or durable task."""
        from .. import registry
        from ..catalog import definition_data

        definition = registry.find(name)
        if definition is None:
            raise exceptions.NotFound(f"No workflow is registered under the name {name[:80]!r}.")
        return Response(DefinitionSerializer(definition_data(definition)).data)

    @document(request=DescribeSerializer, responses={200: ShapeSerializer, **errors_for(400, 404)})
    @action(detail=True, methods=["post"])
    def describe(self, request, name=None):
        """The shape of a run started with the given input (durable.describe(workflow, **kwargs)):
        a branch on the input goes its way, a wait's timeout from the input shows its seconds."""
        from .. import registry
        from ..engine.describe import describe

        definition = registry.find(name)
        if definition is None:
            raise exceptions.NotFound(f"No workflow is registered under the name {name[:80]!r}.")
        body = DescribeSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return Response(ShapeSerializer(describe(definition.name, **body.validated_data["kwargs"])).data)


class EventView(DurableView, APIView):
    """Events: delivered to the runs waiting for them now, and kept for those that begin to wait
    later (DURABLE_EVENT_RETENTION; ctx.wait_for_event)."""

    action = "emit"
    required_permissions = {"emit": "signal_workflowrun"}
    throttle_scopes = {"emit": "signal"}

    @document(request=EventSerializer, examples=[OpenApiExample(
        "event", request_only=True, description="The event's value goes under payload; other keys are refused.",
        value={"payload": {"order_id": 42}})],
        responses={202: EventSentSerializer, **errors_for(400, 413, 429)})
    def post(self, request, name):
        """Emit the event `name`: every run now waiting for it whose match fits takes it."""
        data = _valid(EventSerializer, request)
        delivered = services.emit_event(name, data.get("payload"))
        return Response(EventSentSerializer({"name": name, "delivered": delivered}).data, status=status.HTTP_202_ACCEPTED)


class ApprovalView(DurableView, APIView):
    """Approvals (ctx.wait_for_approval): those the user may decide now, and their decisions.

    Who may decide is the approval's own rule (a permission, a group, listed users), checked for
    each decision; beyond DURABLE_API_PERMISSION_CLASSES no model permission is needed.
    """

    def get_permissions(self):
        return configured_permissions()

    @document(responses={200: ApprovalSerializer(many=True), **errors_for()})
    def get(self, request):
        """The approvals waiting for this user's decision, oldest first."""
        from ..services import approvals

        return Response(ApprovalSerializer(approvals.approvals_for(request.user), many=True).data)


class DecisionView(DurableView, APIView):
    """Approve or reject an approval a run waits for, as the logged-in user."""

    throttle_scopes = {"decide": "signal"}
    action = "decide"

    def get_permissions(self):
        return configured_permissions()

    @document(request=DecideSerializer, responses={200: ApprovalSerializer, **errors_for(404, 409, 429)})
    def post(self, request, pk, key):
        """Decide the approval `key` of run `pk`: 403 unless the user is one of its approvers, 409 once
        it is settled, expired, or decided by this user."""
        from ..services import approvals

        data = _valid(DecideSerializer, request)
        approval = approvals.decide(pk, key, request.user, approve=data["approve"], comment=data["comment"])
        return Response(ApprovalSerializer(approval).data)


class ScheduleViewSet(DurableView, viewsets.GenericViewSet):
    """Schedules: list them, pause, resume, or start a run now."""

    lookup_field = "slug"
    lookup_value_regex = r"[A-Za-z0-9_.:-]{1,100}"
    serializer_class = ScheduleSerializer
    pagination_class = None
    required_permissions = {"list": "view_schedule", "pause": "change_schedule", "resume": "change_schedule",
                            "trigger": "trigger_schedule"}
    throttle_scopes = {"trigger": "start"}

    def get_queryset(self):
        return Schedule.objects.using(conf.get("DATABASE")).order_by("slug")

    @document(responses={200: ScheduleSerializer(many=True), **errors_for()})
    def list(self, request):
        """Every schedule, by slug."""
        return Response(ScheduleSerializer(self.get_queryset(), many=True).data)

    @document(request=None, responses={200: ScheduleSerializer, **errors_for(404)})
    @action(detail=True, methods=["post"])
    def pause(self, request, slug=None):
        """Stop the schedule from firing until it is resumed."""
        return Response(ScheduleSerializer(schedules.pause(self.get_object().slug)).data)

    @document(request=None, responses={200: ScheduleSerializer, **errors_for(404)})
    @action(detail=True, methods=["post"])
    def resume(self, request, slug=None):
        """Let the schedule fire again."""
        return Response(ScheduleSerializer(schedules.resume(self.get_object().slug)).data)

    @document(request=None, responses={202: RunSummarySerializer, **errors_for(404, 429)})
    @action(detail=True, methods=["post"])
    def trigger(self, request, slug=None):
        """Start a run of the schedule's workflow now, outside its fire times."""
        run = schedules.trigger(self.get_object().slug)
        return Response(RunSummarySerializer(run).data, status=status.HTTP_202_ACCEPTED)


class QueueViewSet(DurableView, viewsets.ViewSet):
    """Queues steered at runtime: pause, resume, limits that override DURABLE_QUEUES, cleared."""

    lookup_field = "name"
    lookup_value_regex = r"[^/]{1,100}"
    required_permissions = {"list": "view_workflowrun", "pause": "change_queuecontrol",
                            "resume": "change_queuecontrol", "limits": "change_queuecontrol",
                            "destroy": "change_queuecontrol"}

    def _state(self, name: str) -> dict:
        from ..services import queue_control

        found = next((state for state in queue_control.queue_states() if state["name"] == name), None)
        return QueueStateSerializer(found or {"name": name, "paused": False, "reason": "", "pending": 0,
                                              "configured": "no limits", "overrides": {}, "in_force": "no limits",
                                              "changed_at": None, "changed_by": ""}).data

    @document(responses={200: QueueStateSerializer(many=True), **errors_for()})
    def list(self, request):
        """Every queue with work, limits or a runtime change: paused or not, its limits as set and in force."""
        from ..services import queue_control

        return Response(QueueStateSerializer(queue_control.queue_states(), many=True).data)

    @document(request=QueuePauseSerializer, responses={200: QueueStateSerializer, **errors_for(400)})
    @action(detail=True, methods=["post"])
    def pause(self, request, name=None):
        """Stop every worker claiming from the queue, from its next claim on (what they hold runs on)."""
        from ..services import queue_control

        data = _valid(QueuePauseSerializer, request)
        queue_control.pause_queue(name, reason=data["reason"], by=self.by())
        return Response(self._state(name))

    @document(request=None, responses={200: QueueStateSerializer, **errors_for(400)})
    @action(detail=True, methods=["post"])
    def resume(self, request, name=None):
        """Let the workers claim from the queue again."""
        from ..services import queue_control

        queue_control.resume_queue(name, by=self.by())
        return Response(self._state(name))

    @document(request=QueueLimitsSerializer, responses={200: QueueStateSerializer, **errors_for(400)})
    @action(detail=True, methods=["put"])
    def limits(self, request, name=None):
        """Override the queue's limits of DURABLE_QUEUES (those given; null drops one), on every
        worker within a second."""
        from ..services import queue_control

        data = _valid(QueueLimitsSerializer, request)
        try:
            queue_control.set_queue_limits(name, by=self.by(), **data)
        except ValueError as exc:
            raise exceptions.ValidationError({"limits": [str(exc)]}) from None
        return Response(self._state(name))

    @document(responses={204: None, **errors_for(404)})
    def destroy(self, request, name=None):
        """Clear the queue's runtime changes: not paused, its limits DURABLE_QUEUES' again. 404 if it had none."""
        from ..services import queue_control

        if not queue_control.clear_queue(name, by=self.by()):
            raise exceptions.NotFound(f"The queue {name} has no change made at runtime.")
        return Response(status=status.HTTP_204_NO_CONTENT)


class SchemaView(DurableView, SpectacularAPIView):
    """The OpenAPI schema of these routes, with the server URL where they are mounted."""

    action = "schema"
    required_permissions = {"schema": "view_workflowrun"}
    urlconf = "django_durable.api.urls"
    schema = None  # not a route of its own schema
    renderer_classes = SpectacularAPIView.renderer_classes

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), "application/json"
        return response  # an error is JSON like every other, not a schema document

    def get(self, request, *args, **kwargs):
        base = request.path[: -len("schema/")] if request.path.endswith("schema/") else request.path
        self.custom_settings = {
            "TITLE": "django-durable", "VERSION": "1", "SERVERS": [{"url": base.rstrip("/") or "/"}],
            "ENUM_NAME_OVERRIDES": {
                "RunStatusEnum": WorkflowRun.Status.choices, "StepStatusEnum": Step.Status.choices,
                "ScheduleStatusEnum": Schedule.Status.choices, "StepKindEnum": Step.Kind.choices,
                "RunKindEnum": ["workflow", "task"],
            },
            "DESCRIPTION": "Durable workflow runs: start, status, cancel, signals, events, results, schedules. "
                           "Errors are {\"error\": {\"code\", \"message\"}} with stable codes.",
            "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                                     "django_durable.api.views.workflow_inputs"],
        }
        return super().get(request, *args, **kwargs)


def workflow_inputs(result, generator, request, public):
    """The input each workflow declares (``input=`` a serializer), as a component of the schema,
    which a start's `kwargs` may take."""
    import re

    from .. import registry
    from ..catalog import input_schema

    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    refs = []
    for definition in registry.definitions():
        schema = input_schema(definition)
        if schema is None:
            continue
        component = "WorkflowInput." + re.sub(r"[^A-Za-z0-9._-]", "_", definition.name)
        schemas[component] = {**schema, "description": f"The kwargs of a run of {definition.name}."}
        refs.append({"$ref": f"#/components/schemas/{component}"})
    start = schemas.get("StartRequest") or schemas.get("Start")
    if refs and start is not None and "kwargs" in start.get("properties", {}):
        start["properties"]["kwargs"] = {
            "anyOf": [*refs, {"type": "object", "additionalProperties": {}}],
            "description": "The workflow's keyword arguments: for a workflow that declares its input, "
                           "its WorkflowInput component.",
        }
    return result


def _valid(serializer_class, request) -> dict:
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def _datetime(text: str, name: str):
    try:
        return _utc(text)
    except ValueError as exc:
        raise exceptions.ValidationError({name: [str(exc)]}) from None


def _utc(text: str) -> dt.datetime:
    """An ISO 8601 time with its offset, in UTC (PostgreSQL takes offsets up to 15:59 only)."""
    try:
        when = parse_datetime(text)
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ValueError("Give an ISO 8601 date and time with its offset.")
    try:
        return when.astimezone(dt.timezone.utc)
    except OverflowError:
        raise ValueError("The date is out of range.") from None


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise exceptions.ValidationError({"wait": ["Give a number of seconds."]}) from None
    if not 0 <= seconds < float("inf"):
        raise exceptions.ValidationError({"wait": ["Give a number of seconds."]})
    return seconds


def _release_connection() -> None:
    """Give the connection back while waiting; inside ATOMIC_REQUESTS it must stay."""
    connection = connections[conf.get("DATABASE")]
    if not connection.in_atomic_block:
        connection.close()
