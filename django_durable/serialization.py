"""JSON encoding of inputs, results and errors, with datetime, date, time, timedelta, Decimal and UUID.

Nothing is ever pickled. Values are converted to plain JSON, where the extra types become tagged
objects (``{"__durable__": "datetime", "v": "..."}``), and anything else is rejected with an error
that names the type and where in the value it was found. Tuples are stored as lists.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from decimal import Decimal
from typing import Any

from django.utils.duration import duration_iso_string

from . import payloads
from .exceptions import NotSerializable, PayloadTooLarge

TAG = "__durable__"
MAX_DEPTH = 100

_PLAIN = (str, int, bool, type(None))
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def encode(value: Any, *, what: str = "value", max_bytes: int | None = None, owner=None) -> str:
    """Return `value` as JSON text; raise NotSerializable or PayloadTooLarge.

    With an `owner` (the run it belongs to) and DURABLE_PAYLOAD_OFFLOAD_BYTES set, a value larger
    than that is streamed to STORAGES["durable"] and the text is a reference to it (payloads.py)."""
    plain = value if type(value) in _PLAIN else _to_json(value, what, 0)
    if owner is not None and (limit := payloads.threshold()) is not None:
        text = payloads.encode_plain(plain, owner, limit, dumps)
        if text.startswith(payloads.PREFIX):
            return text
    else:
        text = dumps(plain)
    if max_bytes is not None and len(text) > max_bytes // 4 and len(text.encode()) > max_bytes:
        raise PayloadTooLarge(
            f"The {what} is {len(text.encode())} bytes of JSON, more than the limit of {max_bytes} "
            f"bytes (DURABLE_MAX_PAYLOAD_BYTES). Store large data elsewhere and pass a reference."
        )
    return text


def dumps(plain: Any, *, indent: int | None = None, spaced: bool = False) -> str:
    """JSON text of plain JSON values that can be stored and sent as UTF-8: non-ASCII as it is,
    unless the value holds a lone surrogate (valid JSON, not UTF-8): then all of it is escaped.
    `spaced` puts a space after commas and colons on one line, for people (it wraps between items)."""
    if indent is None and not spaced:  # what is stored: one kept encoder (json.dumps makes one a call)
        separators = (",", ":")
        text = _COMPACT.encode(plain)
    else:
        separators = (", ", ": ") if spaced else (",", ": ")
        text = json.dumps(plain, ensure_ascii=False, separators=separators, indent=indent)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = json.dumps(plain, separators=separators, indent=indent)
    return text


def decode(text: str | None) -> Any:
    """Return the value encoded in `text` (None for None)."""
    if text is None:
        return None
    if type(text) is str:
        return _JSON_DECODER.decode(text)
    return json.loads(text, object_hook=_from_tagged)


def replayed(value: Any, text: str) -> Any:
    """What a replay will return for `value`, just stored as `text`: decode(text); for a payload
    stored apart, `value` converted the same way without reading it back (it is in memory)."""
    if type(value) in _PLAIN and not text.startswith(payloads.PREFIX):
        return value  # a string, a number, a boolean or None reads back as itself
    if not text.startswith(payloads.PREFIX):
        return decode(text)
    return _from_plain(value if type(value) in _PLAIN else _to_json(value, "value", 0))


def _from_plain(obj: Any) -> Any:
    """decode(dumps(obj)) for plain JSON values, without the text: tagged values become their types."""
    kind = type(obj)
    if kind is list:
        return [_from_plain(item) for item in obj]
    if kind is dict:
        return _from_tagged({key: _from_plain(item) for key, item in obj.items()})
    return obj


def display(text: str | None) -> Any:
    """The value encoded in `text` as plain JSON for people and clients (None for None).

    One convention on every surface (the API, the admin, the command line): Decimal, UUID,
    datetime, date and time become strings (the Decimal keeps its digits: "42.00", never a
    float), a timedelta becomes an ISO 8601 duration ("P0DT00H05M00S"). The stored
    ``{"__durable__": ...}`` form never shows.
    """
    if text is None:
        return None
    return json.loads(text, object_hook=_displayed)


def display_text(text: str | None, *, indent: int | None = None) -> str:
    """display() as JSON text for people: on one line with a space after commas and colons, or
    indented; stored text that is not JSON is returned as it is."""
    if text is None:
        return ""
    try:
        return dumps(display(text), indent=indent, spaced=indent is None)
    except ValueError:
        return text


def _displayed(obj: dict) -> Any:
    tag = obj.get(TAG)
    if tag is None or len(obj) != 2 or "v" not in obj:
        return obj
    if tag == payloads.TAG:
        return payloads.shown(obj["v"])
    if tag == "dict":
        return {k: item for k, item in obj["v"]}
    if tag == "timedelta":
        return duration_iso_string(_DECODERS["timedelta"](obj["v"]))
    if tag in _DECODERS:
        return obj["v"]  # already the string a person reads
    raise ValueError(f"Unknown stored type tag {tag!r}.")


def _to_json(value: Any, where: str, depth: int) -> Any:
    kind = type(value)
    if kind in _PLAIN:
        return value
    if depth > MAX_DEPTH:
        raise NotSerializable(f"{where} is nested more than {MAX_DEPTH} levels deep.")
    if kind is float:
        if not math.isfinite(value):
            raise NotSerializable(f"{where} is {value!r}, which JSON cannot represent.")
        return value
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise NotSerializable(
                    f"{where} has a key {key!r} of type {type(key).__name__}; keys must be str."
                )
            out[key] = _to_json(item, f"{where}[{key!r}]", depth + 1)
        # A user's dict that has our tag key is stored as a list of pairs, which the
        # bottom-up decoder cannot mistake for a tagged value.
        return {TAG: "dict", "v": [[k, v] for k, v in out.items()]} if TAG in out else out
    if kind is list or kind is tuple:
        return [_to_json(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if kind is dt.datetime:
        return {TAG: "datetime", "v": value.isoformat()}
    if kind is dt.date:
        return {TAG: "date", "v": value.isoformat()}
    if kind is dt.time:
        return {TAG: "time", "v": value.isoformat()}
    if kind is dt.timedelta:
        return {TAG: "timedelta", "v": [value.days, value.seconds, value.microseconds]}
    if kind is Decimal:
        if not value.is_finite():
            raise NotSerializable(f"{where} is {value!r}, which cannot be stored.")
        return {TAG: "decimal", "v": str(value)}
    if kind is uuid.UUID:
        return {TAG: "uuid", "v": str(value)}
    # Subclasses of str and int (TextChoices, IntEnum members) are stored as their plain value.
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if hasattr(value, "_meta") and hasattr(value, "pk"):  # a model instance: its row may change before a step runs
        raise NotSerializable(
            f"{where} is a {kind.__module__}.{kind.__qualname__} (a model instance), which cannot be stored: pass its "
            f"primary key "
            f"({kind.__qualname__.lower()}_id={value.pk!r}) and read the row in the step, or start the run with "
            f"subject={kind.__qualname__.lower()} to tie the run to the row."
        )
    raise NotSerializable(
        f"{where} is of type {kind.__module__}.{kind.__qualname__}, which cannot be stored: use "
        f"JSON types (dict, list, str, int, float, bool, None) or datetime, date, time, "
        f"timedelta, Decimal, UUID."
    )


_DECODERS = {
    "datetime": dt.datetime.fromisoformat,
    "date": dt.date.fromisoformat,
    "time": dt.time.fromisoformat,
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "decimal": Decimal,
    "uuid": uuid.UUID,
    "dict": lambda v: {k: item for k, item in v},
}


def _from_tagged(obj: dict) -> Any:
    tag = obj.get(TAG)
    if tag is None or len(obj) != 2 or "v" not in obj:
        return obj
    if tag == payloads.TAG:
        return payloads.load(obj["v"], _from_tagged)
    try:
        return _DECODERS[tag](obj["v"])
    except KeyError:
        raise ValueError(f"Unknown stored type tag {tag!r}.") from None


# decode()'s decoder, made once: json.loads(text, object_hook=…) makes one at each call, half the
# cost of decoding a small value.
_JSON_DECODER = json.JSONDecoder(object_hook=_from_tagged)


MAX_MESSAGE_CHARS = 10_000
MAX_TRACEBACK_CHARS = 50_000


EARLIER_KEPT = 20
EARLIER_TRACEBACK_CHARS = 2_000


def dumps_error(exc: BaseException, traceback_text: str = "", *, attempt: int | None = None,
                earlier: str | None = None) -> str:
    """Return the JSON text recording an exception: its type, message and traceback (truncated).

    For a step's failed `attempt`, `earlier` is the error recorded for the attempt before (with
    its own earlier ones): the new record keeps them under "earlier", oldest first (the last
    EARLIER_KEPT, their tracebacks cut to their ends), so a retry never erases the evidence of
    the attempts before it.
    """
    kind = type(exc)
    error = {
        "type": f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__,
        "message": _truncate(_safe_str(exc), MAX_MESSAGE_CHARS),
        # The end of a traceback is where the error is: keep that part.
        "traceback": _truncate(traceback_text, MAX_TRACEBACK_CHARS, keep_end=True),
    }
    if attempt is not None:
        error["attempt"] = attempt
    if earlier:
        error["earlier"] = _earlier(earlier)
    return dumps(error)


def _earlier(text: str) -> list[dict]:
    try:
        previous = json.loads(text)
    except ValueError:
        return []
    if not isinstance(previous, dict):
        return []
    chain = previous.pop("earlier", None)
    chain = chain if isinstance(chain, list) else []
    previous["traceback"] = _truncate(str(previous.get("traceback", "")), EARLIER_TRACEBACK_CHARS, keep_end=True)
    return [*chain, previous][-EARLIER_KEPT:]


def error_history(text: str | None) -> list[dict]:
    """Every attempt's error in a stored error, oldest first: [{"attempt", "type", "message"}]."""
    if not text:
        return []
    try:
        error = json.loads(text)
    except ValueError:
        return [{"attempt": None, "type": "", "message": text[:1000]}]
    if not isinstance(error, dict):
        return [{"attempt": None, "type": "", "message": str(error)[:1000]}]
    chain = error.get("earlier") if isinstance(error.get("earlier"), list) else []
    return [{"attempt": entry.get("attempt"), "type": str(entry.get("type", "")),
             "message": str(entry.get("message", ""))[:1000]}
            for entry in [*chain, error] if isinstance(entry, dict)]


def error_parts(text: str | None, *, limit: int = 1000) -> dict | None:
    """The type and message of a stored error (the message cut at `limit`), never its traceback."""
    if not text:
        return None
    try:
        error = decode(text)
    except ValueError:
        return {"type": "", "message": text[:limit]}
    if not isinstance(error, dict):
        return {"type": "", "message": str(error)[:limit]}
    return {"type": str(error.get("type", "")), "message": str(error.get("message", ""))[:limit]}


def error_line(text: str | None, *, limit: int = 500) -> str:
    """A stored error as one log line, 'Type: message' (the message's line breaks folded)."""
    parts = error_parts(text, limit=limit)
    if parts is None:
        return ""
    message = " ".join(parts["message"].split())
    return f"{parts['type']}: {message}" if parts["type"] else message


def _truncate(text: str, limit: int, keep_end: bool = False) -> str:
    if len(text) <= limit:
        return text
    note = f"[... {len(text) - limit} characters cut ...]"
    return note + "\n" + text[-limit:] if keep_end else text[:limit] + note


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not hide the failure itself
        return f"<unprintable {type(exc).__name__}>"
