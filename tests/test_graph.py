"""The graph of a workflow's shape and of a run, drawn on the server (admin/graph.py), through the
admin's pages and Django's test client; the browser sees it kept current in test_admin_browser.py."""

import re

import pytest
from django.contrib.auth.models import Permission

import django_durable as durable
from django_durable.admin import graph
from django_durable.models import WorkflowRun
from django_durable.testing import drain

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = "/admin/django_durable/workflowrun/"


def noop(*args):
    return "ok"


def pick(*args):
    return "premium"


@durable.workflow("tests.graph.long")
def long(ctx, tier="basic"):
    """Fifty steps, a switch, a parallel pair, a child and a wait."""
    for index in range(50):
        ctx.step(f"s{index:02d}", noop, index)
    ctx.switch("route", tier, {"premium": ("premium", lambda t: ctx.step("express", noop)),
                               "basic": ("basic", lambda t: ctx.step("ground", noop))})
    ctx.parallel([ctx.call("left", noop), ctx.call("right", noop)], key="pair")
    ctx.child("kid", "tests.graph.kid")
    ctx.wait_for_signal("done")


@durable.workflow("tests.graph.kid")
def kid(ctx):
    return ctx.step("only", noop)


@durable.workflow("tests.graph.wide")
def wide(ctx, n, bad=-1):
    once = durable.RetryPolicy(max_attempts=1)
    results = ctx.parallel([ctx.call(f"b:{i}", fails_if, i, bad, retry=once) for i in range(n)], key="fan",
                           return_exceptions=True)
    return sum(1 for result in results if isinstance(result, durable.StepFailed))


def fails_if(index, bad):
    if index == bad:
        raise ValueError("this branch fails")
    return index


def boxes(svg: str) -> list[str]:
    """The keys of the boxes drawn, in the order drawn."""
    return re.findall(r'<g class="durable-node[^"]*" data-key="([^"]*)"', svg)


def svg_of(content: str) -> str:
    match = re.search(r'<svg class="durable-graph".*?</svg>', content, re.S)
    assert match, "no graph on the page"
    return match.group(0)


def test_a_definition_page_draws_fifty_steps_a_switch_branches_and_a_child(admin_client):
    page = admin_client.get("/admin/django_durable/definition/tests.graph.long/").content.decode()
    svg = svg_of(page)
    drawn = boxes(svg)
    assert drawn[:50] == [f"s{index:02d}" for index in range(50)]
    # the switch's two paths side by side, each labelled, then the pair, the child and the wait
    assert {"express", "ground", "left", "right", "kid", "done"} <= set(drawn)
    assert ">premium<" in svg and ">basic<" in svg
    xs = {key: float(x) for key, x in re.findall(r'data-key="([^"]*)"><title>[^<]*</title><rect x="([\d.]+)"', svg)}
    assert xs["express"] != xs["ground"] and xs["left"] != xs["right"]
    assert xs["s00"] == xs["s05"] != xs["s01"]  # three abreast, back and forth
    height = float(re.search(r'viewBox="0 0 [\d.]+ ([\d.]+)"', svg).group(1))
    assert height < 1500  # not fifty boxes under one another
    # the child opens its own workflow's page
    assert 'href="/admin/django_durable/definition/tests.graph.kid/"' in svg
    width = float(re.search(r'viewBox="0 0 ([\d.]+) ', svg).group(1))
    assert width < 700


def test_a_run_graph_gives_each_box_its_status_and_time_and_links_its_child(admin_client):
    run = durable.start("tests.graph.long", tier="premium")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    svg = svg_of(admin_client.get(f"{RUNS}{run.pk}/change/").content.decode())
    drawn = boxes(svg)
    assert drawn[0] == "start" and drawn[1:51] == [f"s{index:02d}" for index in range(50)]
    assert "express" in drawn and "ground" not in drawn  # the path taken, not the other
    assert 'class="durable-node durable-node-step durable-node-completed" data-key="s00"' in svg
    assert 'durable-node-wait durable-node-waiting" data-key="signal:done:0"' in svg
    child = WorkflowRun.objects.get(parent=run)
    assert f'href="{RUNS}{child.pk}/change/"' in svg
    # the child's own page has its own graph
    assert boxes(svg_of(admin_client.get(f"{RUNS}{child.pk}/change/").content.decode())) == ["start", "only",
                                                                                              "completed"]
    # the live page asks for its graph again at the run's events; a finished one does not
    page = admin_client.get(f"{RUNS}{run.pk}/change/").content.decode()
    assert f'data-graph="{RUNS}{run.pk}/graph/"' in page and "new EventSource" in page
    assert "new EventSource" not in admin_client.get(f"{RUNS}{child.pk}/change/").content.decode()


def test_a_fan_out_of_500_is_drawn_as_counts_per_status(admin_client):
    run = durable.start("tests.graph.wide", n=500, bad=7)
    drain(max_items=1)  # the run's first advance: the group and its 500 branches, none started
    svg = svg_of(admin_client.get(f"{RUNS}{run.pk}/graph/").content.decode())
    assert boxes(svg) == ["start", "500 pending"]
    drain()
    svg = svg_of(admin_client.get(f"{RUNS}{run.pk}/graph/").content.decode())
    assert boxes(svg) == ["start", "1 failed", "499 completed", "completed"]
    assert "of 500 branches of fan" in svg
    width = float(re.search(r'viewBox="0 0 ([\d.]+) ', svg).group(1))
    assert width < 700


def test_a_few_branches_are_drawn_each_with_its_status():
    run = durable.start("tests.graph.wide", n=3, bad=1)
    drain()
    svg = graph.of_run(WorkflowRun.objects.get(pk=run.pk))
    assert boxes(svg) == ["start", "b:0", "b:1", "b:2", "completed"]
    assert 'durable-node-failed" data-key="b:1"' in svg


def test_keys_and_names_are_escaped():
    svg = graph.render([graph.Node("<script>x</script>", "a & b", link='"/><script>')], label="<b>")
    assert "<script>" not in svg and "&lt;script&gt;" in svg and "a &amp; b" in svg


def test_the_graph_and_the_events_need_the_permission_to_view_runs(client, django_user_model):
    run = durable.start("tests.graph.kid")
    drain()
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    client.force_login(user)
    assert client.get(f"{RUNS}{run.pk}/graph/").status_code == 403
    assert client.get(f"{RUNS}{run.pk}/events/").status_code == 403
    user.user_permissions.set(Permission.objects.filter(codename="view_workflowrun"))
    response = client.get(f"{RUNS}{run.pk}/graph/")
    assert response.status_code == 200 and response["Content-Type"] == "image/svg+xml"
    assert boxes(response.content.decode()) == ["start", "only", "completed"]
    events = client.get(f"{RUNS}{run.pk}/events/")
    assert events["Content-Type"] == "text/event-stream"
    frames = b"".join(events.streaming_content).decode()  # the run has ended: the stream ends at once
    assert "event: end" in frames and '"ok"' not in frames  # no values without the payload permission
