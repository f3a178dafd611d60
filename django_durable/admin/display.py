"""How the admin shows durable values: times, durations, statuses, JSON and errors, always escaped."""

from __future__ import annotations

import json
import re

from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import mark_safe

from .. import serialization
from ..humanize import between, describe_cron, duration, humanize_interval, relative, short_id  # noqa: F401 - the admin's helpers

TRUNCATE_CHARS = 3000  # pretty JSON beyond this is cut, with a link to see it all


def status_badge(status: str, label: str | None = None):
    return format_html('<span class="durable-badge durable-{}">{}</span>', status, label or status.replace("_", " "))


def pretty_json(text: str | None, *, limit: int | None = TRUNCATE_CHARS) -> tuple[str, bool]:
    """(pretty JSON text, whether it was cut), in serialization.display()'s convention (a
    Decimal is "42.00", never the stored tag). Stored text that is not JSON is shown as it is."""
    if text is None:
        return "", False
    pretty = serialization.display_text(text, indent=2)
    if limit is not None and len(pretty) > limit:
        return pretty[:limit], True
    return pretty, False


def delivery(item) -> str:
    """A work item's delivery as the worker logs name it: "2 of 5" while claimed, "1 lost, next 2
    of 5" when a lost worker handed it back, "" once it ended (its count restarts at each finish).

    `attempts` counts the claims since the item last finished; DURABLE_MAX_DELIVERIES of them
    without finishing fail it.
    """
    from .. import conf

    most = conf.get("MAX_DELIVERIES")
    if item.status == "processing":
        return f"{item.attempts} of {most}"
    if item.status == "pending" and item.attempts:
        return f"{item.attempts} lost, next {item.attempts + 1} of {most}"
    if item.status == "failed" and item.attempts >= most:
        return f"{item.attempts} of {most}, ran out"
    return ""


SHORT_VALUE_CHARS = 160


def value_text(text: str | None) -> tuple[str, bool]:
    """(a stored value as people read it, whether it is long): a short value on one line with
    spaces after commas and colons (so it wraps between items, never inside a word), a long one
    pretty-printed and cut at TRUNCATE_CHARS."""
    if text is None:
        return "", False
    compact = serialization.display_text(text)
    if len(compact) <= SHORT_VALUE_CHARS:
        return compact, False
    return pretty_json(text, limit=TRUNCATE_CHARS)[0], True


_TYPE = re.compile(r'"type":\s*"((?:[^"\\]|\\.)*)"')
_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.){0,300})')


def error_summary(text: str | None, *, with_message: bool = True, limit: int = 120) -> str:
    """'module.Type: message' from a stored error, read from its start only (it may be cut)."""
    if not text:
        return ""
    try:
        error = serialization.decode(text)
    except ValueError:
        kind = _TYPE.search(text)
        message = _MESSAGE.search(text)
        error = {
            "type": json.loads(f'"{kind.group(1)}"') if kind else "",
            "message": _unescape(message.group(1)) if message else "",
        }
    if not isinstance(error, dict):
        return str(error)[:limit]
    kind = str(error.get("type", "")).rpartition(".")[2]
    summary = f"{kind}: {error.get('message', '')}" if with_message else kind
    return summary if len(summary) <= limit else summary[: limit - 1] + "…"


def _unescape(fragment: str) -> str:
    try:
        return json.loads(f'"{fragment.rstrip(chr(92))}"')
    except ValueError:
        return fragment


def definition_list(rows):
    """<dl> of (label, value) pairs; values are escaped unless already safe."""
    return format_html('<dl class="durable-facts">{}</dl>',
                       format_html_join("", "<dt>{}</dt><dd>{}</dd>", ((k, v) for k, v in rows)))


def breakable(text: str):
    """`text` with a line-break opportunity (<wbr>) after each dot and underscore, escaped."""
    return mark_safe(re.sub(r"([._])", r"\1<wbr>", escape(text)))


def progress_text(text: str | None) -> str:
    """A ctx.set_progress() entry as people read it: "3 of 10: packing"."""
    value = serialization.display(text) or {}
    done, total, message = value.get("done"), value.get("total"), value.get("message")
    said = f"{done} of {total}" if total is not None else f"{done}"
    return f"{said}: {message}" if message else said
