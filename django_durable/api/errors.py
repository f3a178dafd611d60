"""Errors as JSON with stable codes, never a traceback; request bodies checked before any write."""

from __future__ import annotations

import codecs
import json
import logging
import re

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.parsers import JSONParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler

from .. import conf
from ..exceptions import (
    DurableError,
    InvalidArguments,
    InvalidInput,
    InvalidTransition,
    NotSerializable,
    PayloadTooLarge,
    RunFinished,
    SubjectBusy,
)

logger = logging.getLogger("django_durable.api")

# The error codes a client can rely on; field errors carry "invalid" unless one of FIELD_CODES.
FIELD_CODES = {"unknown_workflow", "invalid_payload", "invalid_arguments", "invalid_input", "unknown_field"}


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


class EventStreamRenderer(BaseRenderer):
    """Lets a client that accepts only text/event-stream (an EventSource) reach the stream route,
    whose events are a streaming response of their own (its errors are JSON: the view's
    handle_exception); anything rendered here anyway is one `error` event."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return f"event: error\ndata: {json.dumps(data, default=str)}\n\n".encode()


class TooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"
    default_detail = "The request body is larger than DURABLE_MAX_PAYLOAD_BYTES allows."


class SafeJSONRenderer(JSONRenderer):
    """DRF's JSON renderer with every non-ASCII character escaped: a run's input may hold a lone
    surrogate (valid JSON, not encodable as UTF-8), and an answer must never fail to render."""

    ensure_ascii = True


class SafeJSONParser(JSONParser):
    """DRF's JSON parser, with a nesting too deep for Python's parser a 400 rather than a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding", "utf-8")
        try:
            return json.load(codecs.getreader(encoding)(stream), parse_constant=json_strict_constant)
        except ValueError as exc:
            raise exceptions.ParseError(f"The body is not valid JSON: {exc}", code="invalid_json") from None
        except RecursionError:
            raise exceptions.ParseError("The body's JSON is nested too deeply.", code="invalid_json") from None


def json_strict_constant(name):
    raise ValueError(f"{name} is not valid JSON")


def check_body_size(request) -> None:
    """Refuse a body larger than the payload limit (plus room for the envelope) before reading it."""
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > int(conf.get("MAX_PAYLOAD_BYTES")) + 64 * 1024:
        raise TooLarge()


def translate(exc: Exception) -> Exception:
    """The API exception that stands for a durable error."""
    if isinstance(exc, Http404):
        return exceptions.NotFound("Not found.")  # never Django's message: it may name the lookup
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied()
    if isinstance(exc, RunFinished):
        return Conflict(f"The run already ended {exc.status}.", code="run_finished")
    if isinstance(exc, InvalidTransition):
        return Conflict(str(exc), code="invalid_transition")
    if isinstance(exc, SubjectBusy):  # (singleton_busy="refuse")
        return Conflict(str(exc), code="busy")
    if isinstance(exc, LookupError) and isinstance(exc, DurableError):  # no such run, step or approval
        return exceptions.NotFound("Not found.", code="not_found")
    if isinstance(exc, PayloadTooLarge):
        return TooLarge(str(exc))
    if isinstance(exc, InvalidInput):
        return exceptions.ValidationError({f"kwargs.{field}": messages for field, messages in exc.errors.items()},
                                          code="invalid_input")
    if isinstance(exc, InvalidArguments):
        field = f"kwargs.{exc.argument}" if exc.argument else "kwargs"
        return exceptions.ValidationError({field: [str(exc)]}, code="invalid_arguments")
    if isinstance(exc, NotSerializable):
        return exceptions.ValidationError({"payload": [str(exc)]}, code="invalid_payload")
    return exc


def check_text(request, path_values: dict) -> None:
    """Refuse a NUL character in the query string or the path: no database column can store one."""
    for name, values in request.query_params.lists():
        if any("\x00" in value for value in values):
            raise exceptions.ValidationError({name: ["Null characters are not allowed."]})
    for name, value in path_values.items():
        if isinstance(value, str) and "\x00" in value:
            raise exceptions.ValidationError({name: ["Null characters are not allowed."]})


def handle(exc, context):
    """DRF's handler, with durable errors translated and every body shaped {"error": {"code", "message"}}."""
    exc = translate(exc)
    response = exception_handler(exc, context)
    if response is None:
        logger.exception("Unexpected error in the durable API", exc_info=exc)
        return Response({"error": {"code": "server_error", "message": "Internal server error."}},
                        status=status.HTTP_500_INTERNAL_SERVER_ERROR)
    detail = getattr(exc, "detail", None)
    body = {"code": _code(exc, detail), "message": _message(detail)}
    if isinstance(exc, exceptions.ValidationError) and isinstance(detail, dict):
        body["message"] = "The request is not valid."
        body["fields"] = dict(_field_errors(detail))
    response.data = {"error": body}
    return response


def _code(exc, detail) -> str:
    codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else None
    if isinstance(codes, str):
        return codes
    if isinstance(codes, list) and codes and isinstance(codes[0], str):
        return codes[0]
    if isinstance(codes, dict):
        # Field errors: "invalid", unless one of ours says more (DRF's own codes are details).
        for _, code in _field_errors(codes):
            if any(item in FIELD_CODES for item in code):
                return next(item for item in code if item in FIELD_CODES)
        return "invalid"
    return getattr(exc, "default_code", "error")


def _field_errors(detail, prefix=""):
    """(field, [messages]) pairs from DRF's nested errors; nested fields are named "kwargs.name"."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            yield from _field_errors(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(detail, list) and any(isinstance(item, (dict, list)) for item in detail):
        for index, value in enumerate(detail):  # a ListField's errors, by position
            if value:
                yield from _field_errors(value, f"{prefix}.{index}" if prefix else str(index))
    else:
        yield prefix or "non_field_errors", [str(item) for item in (detail if isinstance(detail, list) else [detail])]


def _message(detail) -> str:
    if isinstance(detail, list) and detail:
        return str(detail[0])
    if isinstance(detail, dict):
        return "The request is not valid."
    return str(detail) if detail is not None else ""


# A run's id as the admin and the CLI show it (its last 8 digits) or any other piece of one.
PARTIAL_ID = re.compile(r"^workflows/(?P<given>[0-9a-fA-F-]{1,35})(?:/|$)")


@csrf_exempt  # a JSON 404 changes nothing: Django's CSRF page (HTML) must not answer in its place
def not_found(request, path=""):
    """Every other path under the API: a JSON 404 that says what was wrong, without a query."""
    partial = PARTIAL_ID.match(path)
    if partial:
        message = (f"No run has the id {partial['given']!r}: give the run's whole id, a UUID of 36 "
                   "characters (the admin and the command line show its last 8 digits).")
    elif path in ("events/", "events"):
        message = "Name the event in the path: POST events/<name>/."
    elif path.startswith("workflows/"):
        message = "Not found: a run's route is workflows/<id>/..., with the run's whole id (a UUID)."
    else:
        message = "Not found."
    return json_error("not_found", message, 404)


def json_error(code: str, message: str, status: int, **kwargs) -> JsonResponse:
    """An error in the API's shape, {"error": {"code", "message"}}, from a plain Django view."""
    return JsonResponse({"error": {"code": code, "message": message}}, status=status, **kwargs)
