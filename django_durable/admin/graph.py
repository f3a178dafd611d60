"""A workflow's shape and a run's journal drawn as a graph, made as SVG on the server.

Boxes one under the other for what runs in order; side by side, between a fork and a join, for
parallel branches and for each path of a switch. A run's boxes carry their status (the colour) and
time; a fan-out wider than MAX_BRANCHES is drawn as one box per status with its count. A child's
box links to the child's own page. Nothing is fetched and no script draws it: the run page swaps
in a fresh drawing (graph_view) when the run's event stream says something changed.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from .display import between, duration

NODE_W, NODE_H = 190, 40
V_GAP, H_GAP, FORK_GAP = 22, 14, 16  # between boxes in order, between branches, above and below branches
MARGIN = 12
CHAIN_AT, CHAIN_COLS, CHAIN_GAP = 8, 3, 30  # more boxes in a row than CHAIN_AT are drawn three abreast
MAX_BRANCHES = 6  # wider fan-outs are drawn as one box per status, with counts
LABEL_CHARS, DETAIL_CHARS = 25, 30
FILLS = {  # status: (fill, stroke)
    "completed": ("#e8f5e9", "#2e7d32"), "failed": ("#ffebee", "#c62828"), "running": ("#e3f2fd", "#1565c0"),
    "retrying": ("#fff3e0", "#ef6c00"), "waiting": ("#f3e5f5", "#6a1b9a"), "pending": ("#f5f5f5", "#9e9e9e"),
    "processing": ("#e3f2fd", "#1565c0"), "cancelled": ("#eceff1", "#607d8b"),
}
STATUS_ORDER = ("failed", "running", "processing", "retrying", "waiting", "pending", "completed", "cancelled")
WAITS = {"sleep", "signal", "event", "update", "approval"}
HIDDEN = {"note", "log", "progress", "patch"}  # recorded values and what the workflow said: on the timeline
STYLE = (".node-label{font:600 12px sans-serif;fill:#263238}.node-detail{font:11px sans-serif;fill:#455a64}"
         ".node-link{font:12px sans-serif;fill:#1565c0}.edge{fill:none;stroke:#90a4ae;stroke-width:1.5}"
         ".edge-label{font:10px sans-serif;fill:#546e7a}.fork{fill:#90a4ae}a:hover rect{stroke-width:3}")


@dataclass
class Node:
    """One box: its first line (a key, a name), its second (what, status, time), and how it looks."""

    label: str
    detail: str = ""
    kind: str = "step"  # step, wait, child, group, end, stop: the box's style
    status: str = ""  # its colour (none: a shape's box)
    title: str = ""  # the tooltip
    link: str = ""


@dataclass
class Fork:
    """Paths side by side between a fork and a join: each a list of Nodes and Forks."""

    paths: list[list] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # on each path's edge (a switch's branch)


# -- layout and drawing ----------------------------------------------------------------------------


@dataclass
class Chain:
    """More than CHAIN_AT boxes in a row, drawn CHAIN_COLS abreast, back and forth (read as a snake)."""

    nodes: list[Node]

    @property
    def cols(self) -> int:
        return min(CHAIN_COLS, len(self.nodes))

    @property
    def rows(self) -> int:
        return -(-len(self.nodes) // self.cols)


def _chained(items: list) -> list:
    """`items` with each run of more than CHAIN_AT boxes in order made one Chain."""
    out, run = [], []
    for item in [*items, None]:
        if isinstance(item, Node):
            run.append(item)
            continue
        out.extend([Chain(run)] if len(run) > CHAIN_AT else run)
        run = []
        if item is not None:
            out.append(item)
    return out


def _size(items: list) -> tuple[float, float]:
    """The width and height of a path of items."""
    if not items:
        return NODE_W / 3, 0.0
    items = _chained(items)
    width = height = 0.0
    for item in items:
        w, h = _item_size(item)
        width, height = max(width, w), height + h
    return width, height + V_GAP * (len(items) - 1)


def _item_size(item) -> tuple[float, float]:
    if isinstance(item, Node):
        return NODE_W, NODE_H
    if isinstance(item, Chain):
        return item.cols * NODE_W + (item.cols - 1) * CHAIN_GAP, item.rows * NODE_H + (item.rows - 1) * V_GAP
    sizes = [_size(path) for path in item.paths]
    return (sum(w for w, _ in sizes) + H_GAP * (len(sizes) - 1),
            max(h for _, h in sizes) + 2 * FORK_GAP)


def _edge(points: list[tuple[float, float]], *, arrow: bool = True, label: str = "") -> str:
    """A line through `points` (right angles), an arrowhead at its end."""
    d = f"M{points[0][0]:.1f},{points[0][1]:.1f}" + "".join(f" L{x:.1f},{y:.1f}" for x, y in points[1:])
    head = ' marker-end="url(#durable-arrow)"' if arrow else ""
    text = ""
    if label:
        x, y = points[-1]
        text = (f'<text x="{x + 4:.1f}" y="{y - 4:.1f}" class="edge-label">{escape(_cut(label, 18))}'
                f'<title>{escape(label)}</title></text>')
    return f'<path d="{d}" class="edge"{head}/>{text}'


def _draw_path(items: list, cx: float, top: float, out: list[str]) -> tuple[float, float, float, float]:
    """Draw a path of items centred on `cx` from `top`; return its entry (x, y) and its exit (x, y)."""
    if not items:
        return cx, top, cx, top
    y, entry, last = top, None, None
    for item in _chained(items):
        enter_x, bottom, exit_x = _draw_item(item, cx, y, out)
        if last is not None:  # from the exit of the one before (an arrow into a box; a fork has its own)
            arrow = not isinstance(item, Fork)
            if last[0] == enter_x:
                out.append(_edge([last, (enter_x, y)], arrow=arrow))
            else:
                middle = last[1] + V_GAP / 2
                out.append(_edge([last, (last[0], middle), (enter_x, middle), (enter_x, y)], arrow=arrow))
        entry = entry or (enter_x, y)
        last = (exit_x, bottom)
        y = bottom + V_GAP
    return entry[0], entry[1], last[0], last[1]


def _draw_item(item, cx: float, top: float, out: list[str]) -> tuple[float, float, float]:
    """Draw one item centred on `cx` from `top`; return the x of its entry, its bottom and the x of its exit."""
    if isinstance(item, Node):
        out.append(_box(item, cx - NODE_W / 2, top))
        return cx, top + NODE_H, cx
    width, height = _item_size(item)
    bottom, left = top + height, cx - width / 2
    if isinstance(item, Chain):
        return _draw_chain(item, left, top, out)
    for index, path in enumerate(item.paths):
        path_width, _ = _size(path)
        px = left + path_width / 2
        enter_x, enter_y, exit_x, exit_y = _draw_path(path, px, top + FORK_GAP, out)
        label = item.labels[index] if index < len(item.labels) else ""
        if path:
            out.append(_edge([(cx, top), (enter_x, top), (enter_x, enter_y)], label=label))
            out.append(_edge([(exit_x, exit_y), (exit_x, bottom), (cx, bottom)], arrow=False))
        else:  # a path with nothing on it (a switch's branch that does nothing): straight through
            out.append(_edge([(cx, top), (px, top), (px, bottom), (cx, bottom)], arrow=False, label=label))
        left += path_width + H_GAP
    out.append(f'<circle cx="{cx:.1f}" cy="{top:.1f}" r="3" class="fork"/>'
               f'<circle cx="{cx:.1f}" cy="{bottom:.1f}" r="3" class="fork"/>')
    return cx, bottom, cx


def _draw_chain(chain: Chain, left: float, top: float, out: list[str]) -> tuple[float, float, float]:
    places = []
    for index, node in enumerate(chain.nodes):
        row, col = divmod(index, chain.cols)
        if row % 2:
            col = chain.cols - 1 - col  # back the other way
        x, y = left + col * (NODE_W + CHAIN_GAP), top + row * (NODE_H + V_GAP)
        if places:
            px, py = places[-1]
            if py == y:  # beside the one before
                middle = y + NODE_H / 2
                start, end = ((px + NODE_W, middle), (x, middle)) if px < x else ((px, middle), (x + NODE_W, middle))
            else:  # under it
                start, end = (px + NODE_W / 2, py + NODE_H), (x + NODE_W / 2, y)
            out.append(_edge([start, end]))
        out.append(_box(node, x, y))
        places.append((x, y))
    (first_x, _), (last_x, last_y) = places[0], places[-1]
    return first_x + NODE_W / 2, last_y + NODE_H, last_x + NODE_W / 2


def _box(node: Node, x: float, y: float) -> str:
    fill, stroke = FILLS.get(node.status, ("#ffffff", "#546e7a"))
    shape = f'rx="{NODE_H / 2 if node.kind == "end" else 5}"'
    dash = ' stroke-dasharray="5 3"' if node.kind in ("wait", "stop") else ""
    width = 2.5 if node.kind == "child" else 1.5
    status = f" durable-node-{node.status}" if node.status else ""
    title = node.title or " — ".join(part for part in (node.label, node.detail) if part)
    parts = [f'<g class="durable-node durable-node-{node.kind}{status}" data-key="{escape(node.label)}">',
             f"<title>{escape(title)}</title>",
             f'<rect x="{x:.1f}" y="{y:.1f}" width="{NODE_W}" height="{NODE_H}" {shape} fill="{fill}" '
             f'stroke="{stroke}" stroke-width="{width}"{dash}/>',
             f'<text x="{x + 10:.1f}" y="{y + 16:.1f}" class="node-label">{escape(_cut(node.label, LABEL_CHARS))}</text>']
    if node.detail:
        parts.append(f'<text x="{x + 10:.1f}" y="{y + 32:.1f}" class="node-detail">'
                     f'{escape(_cut(node.detail, DETAIL_CHARS))}</text>')
    if node.link:
        parts.append(f'<text x="{x + NODE_W - 16:.1f}" y="{y + 16:.1f}" class="node-link">↗</text>')
    parts.append("</g>")
    drawn = "".join(parts)
    return f'<a href="{escape(node.link)}">{drawn}</a>' if node.link else drawn


def _short(function: str) -> str:
    """A function's own name, without its module (the tooltip has the whole path)."""
    return function.replace(":", ".").rpartition(".")[2] or function


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1] + "…"


def render(items: list, *, label: str) -> SafeString:
    """The SVG (safe HTML) of a path of Nodes and Forks."""
    width, height = _size(items)
    width, height = width + 2 * MARGIN, height + 2 * MARGIN
    out = [f'<svg class="durable-graph" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'width="{width:.0f}" height="{height:.0f}" role="img" aria-label="{escape(label)}">',
           f"<style>{STYLE}</style>",
           '<defs><marker id="durable-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#78909c"/></marker></defs>']
    _draw_path(items, width / 2, MARGIN, out)
    out.append("</svg>")
    return mark_safe("".join(out))


# -- a workflow's shape (durable.describe()) -------------------------------------------------------


def shape_items(nodes: list[dict], *, definition_url=None) -> list:
    """The items of a shape's nodes; `definition_url(name)` links a child to its workflow's page."""
    items = []
    for node in nodes:
        kind = node.get("type")
        if kind == "switch":
            items.append(Fork([shape_items(branch["shape"], definition_url=definition_url)
                               for branch in node["branches"]],
                              [str(branch["id"]) for branch in node["branches"]]))
        elif kind == "parallel":
            shown = [[Node(branch["key"], _short(branch["function"]), title=f"{branch['key']}: {branch['function']}")]
                     for branch in node["branches"]]
            if len(shown) > MAX_BRANCHES:
                rest = len(shown) - MAX_BRANCHES + 1
                shown[MAX_BRANCHES - 1:] = [[Node(f"… {rest} more branches", f"of {node['key']}", "group")]]
            items.append(Fork(shown))
        else:
            items.append(_shape_node(node, definition_url))
    return items


def _shape_node(node: dict, definition_url) -> Node:
    kind = node.get("type", "")
    timeout = node.get("timeout")
    after = "" if not timeout else " (timeout)" if timeout is True else f" (timeout {timeout:g} s)"
    if kind == "step":
        return Node(node["key"], _short(node.get("function", "")), title=f"step {node['key']}: {node.get('function', '')}"
                    + (f", compensated by {node['compensate']}" if node.get("compensate") else ""))
    if kind == "sleep":
        return Node(node["key"], "sleep" + (f" {node['seconds']:g} s" if node.get("seconds") is not None else ""),
                    "wait")
    if kind in ("signal", "event", "update"):
        return Node(node["name"], f"wait for {kind}{after}", "wait")
    if kind == "approval":
        return Node(node["key"], f"approval by {node.get('approvers', '')}{after}", "wait")
    if kind == "map":
        return Node(node["key"], f"for each item: {_short(node.get('function', ''))}", "group",
                    title=f"{node['key']}: {node.get('function', '')} for each item, in parallel")
    if kind == "child":
        link = definition_url(node["workflow"]) if definition_url else ""
        return Node(node["key"], f"child {node['workflow']}" + (" (detached)" if node.get("detached") else ""),
                    "child", link=link or "")
    if kind == "stop":
        return Node("the shape stops here", node.get("reason", ""), "stop", title=node.get("reason", ""))
    if kind == "call":
        return Node(_short(node.get("function", "")), "the task, retried as a whole", title=node.get("function", ""))
    if kind in ("emit", "stream", "close"):
        return Node(node["name"], {"emit": "emit", "stream": "write to stream", "close": "close stream"}[kind])
    if kind == "agent":
        return Node(str(node.get("agent", "agent")), f"agent loop {node.get('keys', '')}", "group")
    return Node(str(node.get("key") or node.get("name") or kind), kind)


# -- a run (its journal) ---------------------------------------------------------------------------


@dataclass
class Entry:
    """What the run graph needs of a journal entry (a Step row, or a branch not started yet)."""

    key: str
    kind: str
    status: str
    name: str = ""
    attempts: int = 1
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    child: str = ""  # a child's run id


def run_items(run, entries: list[Entry], branches: dict[str, list[tuple[str, str]]], *, now: dt.datetime,
              run_url=None, more: int = 0) -> list:
    """The items of a run: a start, its entries in order (each parallel group with its branches:
    `branches` maps a group's key to its (branch key, work item status) in order), and an end.
    `run_url(id)` links a child to its run's page; `more` entries were left out (too many)."""
    by_key = {entry.key: entry for entry in entries}
    in_group = {key for paths in branches.values() for key, _ in paths}
    items: list = [Node("start", f"{run.workflow}", "end", "completed" if run.started_at else "pending",
                        title=f"created {run.created_at:%Y-%m-%d %H:%M:%S}")]
    streams: dict[str, Node] = {}
    for entry in entries:
        if entry.kind in HIDDEN or entry.key in in_group:
            continue
        if entry.kind == "parallel":
            members = branches.get(entry.key) or [(e.key, "") for e in entries if e.key.startswith(f"{entry.key}:")
                                                  and e.key not in in_group]
            items.append(_fan_out(entry, [by_key.get(key) or Entry(key, "step", _pending(status))
                                          for key, status in members], now))
        elif entry.kind == "stream":  # one box per stream, however many values were written to it
            name = entry.key.split(":")[1] if entry.key.count(":") >= 2 else entry.key
            if name in streams:
                streams[name].detail = _count_detail(streams[name].detail)
                continue
            streams[name] = node = Node(name, "stream ×1", "step", entry.status)
            items.append(node)
        else:
            items.append(_run_node(entry, now, run_url))
    if more:
        items.append(Node(f"… {more} more entries", "on the steps' pages", "stop"))
    if run.finished_at is not None:
        items.append(Node(run.status, f"ended after {duration(between(run.created_at, run.finished_at))}", "end",
                          run.status if run.status in FILLS else "cancelled"))
    return items


def _pending(status: str) -> str:
    return {"processing": "running", "completed": "completed", "failed": "failed",
            "cancelled": "cancelled"}.get(status, "pending")


def _count_detail(detail: str) -> str:
    count = int(detail.rpartition("×")[2] or 1)
    return f"stream ×{count + 1}"


def _took(entry: Entry, now: dt.datetime) -> str:
    if entry.started_at is None:
        return ""
    return duration(between(entry.started_at, entry.finished_at or now))


def _run_node(entry: Entry, now: dt.datetime, run_url=None) -> Node:
    kind = {"sleep": "wait", "signal": "wait", "event": "wait", "approval": "wait", "child": "child",
            "rollback": "step"}.get(entry.kind, "step")
    what = {"step": _short(entry.name) or "step", "child": f"child {entry.name}",
            "rollback": "compensation", "switch": "switch"}.get(entry.kind, entry.kind)
    took = _took(entry, now)
    detail = ", ".join(part for part in (entry.status, took) if part) + f" · {what}"
    attempts = f", {entry.attempts} attempts" if entry.attempts > 1 else ""
    title = f"{entry.key}: {what}, {entry.status}{attempts}" + (f", {took}" if took else "")
    if entry.started_at:
        title += f", started {entry.started_at:%Y-%m-%d %H:%M:%S}"
    return Node(entry.key, detail, kind, entry.status, title,
                link=run_url(entry.child) if entry.child and run_url else "")


def _fan_out(group: Entry, members: list[Entry], now: dt.datetime) -> Fork:
    """A parallel group's branches: each its own box, or one box per status past MAX_BRANCHES."""
    if len(members) <= MAX_BRANCHES:
        return Fork([[_run_node(member, now)] for member in members])
    counts: dict[str, int] = {}
    for member in members:
        counts[member.status] = counts.get(member.status, 0) + 1
    order = sorted(counts, key=lambda status: STATUS_ORDER.index(status) if status in STATUS_ORDER else 99)
    return Fork([[Node(f"{counts[status]} {status}", f"of {len(members)} branches of {group.key}", "group", status,
                       title=f"{counts[status]} of the {len(members)} branches of {group.key} are {status}")]
                 for status in order])


GRAPH_ENTRIES = 2000  # a run's graph draws its first entries; the steps' pages have them all
GRAPH_BRANCHES = 20000


def of_run(run, *, run_url=None, now: dt.datetime | None = None, steps=None, items=None) -> SafeString:
    """The graph of `run` as its rows are now (the run page, and graph_view for a live page).
    `steps` and `items`: every Step row and WorkItem row of the run, when the caller has read them all."""
    from django.utils import timezone

    from .. import ids
    from ..models import Step, WorkflowRun, WorkItem

    db = run._state.db or "default"
    if steps is not None:
        rows = [(s.key, s.kind, s.status, s.name, s.attempts, s.started_at, s.finished_at) for s in steps]
    else:
        rows = list(Step.objects.using(db).filter(run=run).order_by("seq")
                    .values_list("key", "kind", "status", "name", "attempts", "started_at", "finished_at")
                    [:GRAPH_ENTRIES + 1])
    more = 0
    if len(rows) > GRAPH_ENTRIES:
        rows = rows[:GRAPH_ENTRIES]
        more = Step.objects.using(db).filter(run=run).count() - GRAPH_ENTRIES
    entries = [Entry(*row) for row in rows]
    keyed = [entry for entry in entries if entry.kind == "child"]
    if keyed:  # a child's id is made from its parent's and its key (once, an older way: ids.legacy_child_id)
        ids_of = {entry.key: (ids.child_id(run.pk, entry.key), ids.legacy_child_id(run.pk, entry.key))
                  for entry in keyed}
        found = set(WorkflowRun.objects.using(db).filter(pk__in=[pk for pair in ids_of.values() for pk in pair])
                    .values_list("pk", flat=True))
        for entry in keyed:
            entry.child = next((str(pk) for pk in ids_of[entry.key] if pk in found), "")
    branches: dict[str, list[tuple[str, str]]] = {}
    if any(entry.kind == "parallel" for entry in entries):
        members = ([(item.step_key, item.group, item.status) for item in items
                    if item.kind == WorkItem.Kind.STEP and item.group] if items is not None else
                   WorkItem.objects.using(db).filter(run=run, kind=WorkItem.Kind.STEP).exclude(group="")
                   .order_by("id").values_list("step_key", "group", "status")[:GRAPH_BRANCHES])
        for key, group, status in members:
            branches.setdefault(group, []).append((key, status))
    return render(run_items(run, entries, branches, now=now or timezone.now(), run_url=run_url, more=more),
                  label=f"Graph of the run {run.pk}")
