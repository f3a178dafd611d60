"""The operator dashboard in a real headless Chromium against a live server.

Debian's chromium and chromium-driver are used as installed (`make test` installs them when
missing); nothing is downloaded. With DURABLE_SCREENSHOTS=<dir> the test also saves the
screenshots the docs show.
"""

import os
import shutil
import time
from pathlib import Path

import pytest

import django_durable as durable
from django_durable.models import Worker, WorkflowEvent, WorkflowRun
from django_durable.testing import drain
from tests.harness.workers import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser(tmp_path):
    if not (CHROMIUM and CHROMEDRIVER):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing; `make test` installs them (apt).")
        pytest.skip("chromium and chromium-driver are not installed (apt install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     "--window-size=1400,1100", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    # Chromium leaves its singleton socket's directory in TMPDIR after it quits: keep it in the test's.
    service = Service(CHROMEDRIVER, env={**os.environ, "TMPDIR": str(tmp_path)})
    driver = webdriver.Chrome(service=service, options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


def log_in(browser, live_server, username: str, next_path: str) -> None:
    """Log in through the admin's login form (password "a-long-password"), then go on to `next_path`."""
    from selenium.webdriver.common.by import By

    browser.get(f"{live_server.url}/admin/login/?next={next_path}")
    browser.find_element(By.NAME, "username").send_keys(username)
    browser.find_element(By.NAME, "password").send_keys("a-long-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    # The click returns before the next page has loaded: a script run at once would run on the form.
    wait_for(lambda: browser.current_url.startswith(f"{live_server.url}{next_path}")
             and browser.execute_script("return document.readyState") == "complete",
             timeout=60, interval=0.1, message=f"{next_path} after logging in")


def screenshot(driver, name: str) -> None:
    target = os.environ.get("DURABLE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(target) / name))


def test_an_operator_finds_a_failure_and_cancels_a_waiting_run(browser, live_server, django_user_model):
    from django.utils import timezone
    from selenium.webdriver.common.by import By

    django_user_model.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    Worker.objects.create(name="web-1:4242", host="web-1", pid=4242, started_at=timezone.now(),
                          last_seen=timezone.now())
    for x in range(3):
        durable.start("tests.three_steps", x=x)
    failed = durable.start("tests.raises", message="the <b>vendor</b> said no")
    waiting = durable.start("tests.approval")
    durable.start("tests.slow_branch")
    durable.start("tests.sleeper", 3600)
    showcase = durable.start("tests.showcase", 1042)
    drain()
    time.sleep(0.35)  # the showcase's durable sleep
    drain()
    assert WorkflowRun.objects.get(pk=showcase.pk).status == "failed"

    # Log in.
    log_in(browser, live_server, "ops", "/admin/django_durable/overview/")

    # The overview: counts by queue, the charts, the latest failure.
    assert browser.find_element(By.TAG_NAME, "h1").text == "Durable workflows: overview"
    table = browser.find_element(By.ID, "durable-status-table").text
    assert "default" in table
    assert browser.find_elements(By.CSS_SELECTOR, "svg.durable-chart rect")
    assert "vendor" in browser.find_element(By.ID, "durable-failures").text
    assert not browser.find_elements(By.CLASS_NAME, "durable-banner")  # a worker reported just now
    screenshot(browser, "overview.png")

    # Filter the runs to the failed ones and open it.
    browser.find_element(By.CSS_SELECTOR, "#durable-status-table a[href$='status=failed']").click()
    rows = {row.find_element(By.CSS_SELECTOR, "td.field-workflow_name").text: row
            for row in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")}
    assert set(rows) == {"tests.raises", "tests.showcase"}
    assert "KeyError" in rows["tests.raises"].text and "ValueError" in rows["tests.showcase"].text
    rows["tests.raises"].find_element(By.CSS_SELECTOR, "th a").click()
    assert str(failed.pk) in browser.find_element(By.CLASS_NAME, "durable-facts").text
    assert "the <b>vendor</b> said no" in browser.find_element(By.ID, "durable-traceback").text  # shown, not run
    browser.back()
    browser.find_element(By.PARTIAL_LINK_TEXT, str(showcase.pk)[-8:]).click()
    bars = browser.find_elements(By.CSS_SELECTOR, "svg.durable-timeline rect")
    assert len(bars) >= 9  # the run, load-order, the group, four branches, the sleep, charge
    assert "↳ quote:ups" in browser.find_element(By.CSS_SELECTOR, "svg.durable-timeline").text
    browser.set_window_size(1400, 1900)
    screenshot(browser, "run-detail.png")
    browser.set_window_size(1400, 1100)

    # Cancel the waiting run through its confirmation page.
    browser.get(f"{live_server.url}/admin/django_durable/workflowrun/{waiting.pk}/change/")
    browser.find_element(By.LINK_TEXT, "Cancel").click()
    assert "Cancel" in browser.find_element(By.TAG_NAME, "h1").text
    browser.find_element(By.NAME, "reason").send_keys("customer withdrew")
    browser.find_element(By.CSS_SELECTOR, "input[name=apply]").click()
    assert "Cancel requested: customer withdrew" in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    facts = browser.find_element(By.CLASS_NAME, "durable-facts").text
    assert "cancelled" in facts
    assert "ops" in browser.find_element(By.ID, "durable-history").text

    run = WorkflowRun.objects.get(pk=waiting.pk)
    assert run.status == "cancelled" and run.get_error()["message"] == "customer withdrew"
    assert WorkflowEvent.objects.filter(run=run, type="cancelled", actor="ops").exists()


def _login(browser, live_server, django_user_model):
    django_user_model.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    log_in(browser, live_server, "ops", "/admin/django_durable/overview/")


def _png_size(data: bytes) -> tuple[int, int]:
    import struct

    return struct.unpack(">II", data[16:24])


def test_the_admin_reads_right_at_1400_pixels(browser, live_server, django_user_model):
    """Issue 12: the run list fits, its last error shows; step values need no scroll box; chart labels are whole."""
    from selenium.webdriver.common.by import By

    for x in range(3):
        durable.start("tests.three_steps", x=x)
    durable.start("tests.raises", message="the payment provider refused the card: insufficient funds " * 2)
    durable.start("tests.approval", timeout=3600)
    durable.start("tests.sleeper", 3600)
    showcase = durable.start("tests.showcase", 1042)
    money = durable.start("tests.money")
    drain()
    time.sleep(0.35)
    drain()
    # Long names without a space, as real projects have them (issue 30: the list scrolled sideways).
    WorkflowRun.objects.create(
        workflow="publishing.approve_and_publish_the_page_after_legal_review_and_translation", status="waiting",
        waiting_on="approval 'legal-review-of-page-1234567890-and-all-of-its-translations'",
        queue="publishing_with_a_long_queue_name", input='{"args": [], "kwargs": {}}')
    task = "example_project.orders.tasks.send_email"  # a django.tasks task's run is named by its path
    WorkflowRun.objects.create(workflow=task, status="pending", input='{"args": [], "kwargs": {}}')
    _login(browser, live_server, django_user_model)
    browser.set_window_size(1400, 900)
    inner = browser.execute_script("return window.innerWidth")

    # The overview: every label of its charts inside the chart.
    clipped = browser.execute_script("""
        const out = [];
        for (const svg of document.querySelectorAll('svg.durable-chart')) {
          const width = svg.viewBox.baseVal.width, height = svg.viewBox.baseVal.height;
          for (const text of svg.querySelectorAll('text')) {
            const box = text.getBBox();
            if (box.x < 0 || box.y < 0 || box.x + box.width > width + 0.5 || box.y + box.height > height + 0.5)
              out.push(text.textContent + ' ' + JSON.stringify([box.x, box.y, box.width, box.height, width, height]));
          }
        }
        return out;""")
    assert clipped == []

    # The run list: no horizontal scrolling, and the last error is on screen.
    browser.get(f"{live_server.url}/admin/django_durable/workflowrun/")
    widths = browser.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= inner, widths
    # The admin wraps the table in a box that scrolls sideways: nothing may be hidden in it.
    box = browser.execute_script("const b = document.querySelector('#changelist .results'); "
                                 "return [b.scrollWidth, b.clientWidth, b.getBoundingClientRect().right];")
    columns = browser.execute_script("return [...document.querySelectorAll('#result_list thead th')].map("
                                     "th => th.className + ':' + Math.round(th.getBoundingClientRect().width));")
    screenshot(browser, "run-list.png")
    assert box[0] <= box[1] + 1, (box, " ".join(columns))
    for cell in browser.find_elements(By.CSS_SELECTOR, "#result_list td.field-last_error"):
        right = browser.execute_script("return arguments[0].getBoundingClientRect().right;", cell)
        assert right <= min(box[2], inner) + 1, (right, box)
    assert "insufficient funds" in browser.find_element(By.ID, "result_list").text
    # A dotted name reads in at most two lines, broken after a dot, never inside a word.
    lines = browser.execute_script("""
        return [...document.querySelectorAll('#result_list td.field-workflow_name .durable-name')].map(name => {
          const range = document.createRange(); range.selectNodeContents(name);
          const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
          return [name.textContent, tops.size, name.innerText.split('\\n')];
        });""")
    named = {text: count for text, count, _ in lines}
    assert named[task] <= 2, lines
    shot = browser.get_screenshot_as_png()
    assert _png_size(shot)[0] == inner
    screenshot(browser, "run-list.png")

    # A run's steps: short values on one line, no box that scrolls, no word cut in two.
    for run in (showcase, money):
        browser.get(f"{live_server.url}/admin/django_durable/workflowrun/{run.pk}/change/")
        boxes = wait_for(lambda: browser.execute_script("""
            return [...document.querySelectorAll('.durable-value')].map(e =>
              [e.textContent, e.scrollHeight > e.clientHeight + 1 || e.scrollWidth > e.clientWidth + 1,
               e.getClientRects().length]);"""), timeout=30, message="the step values to be shown")
        for text, scrolls, _ in boxes:
            assert not scrolls, text
        assert browser.execute_script("return document.documentElement.scrollWidth") <= inner
    assert '"42.00"' in browser.find_element(By.ID, "durable-steps").text  # the money step's result


def test_an_approver_decides_from_the_approval_inbox(browser, live_server, django_user_model):
    from django.contrib.auth.models import Permission
    from selenium.webdriver.common.by import By

    ann = django_user_model.objects.create_user("ann", "ann@example.com", "a-long-password", is_staff=True)
    ann.user_permissions.add(Permission.objects.get(codename="approve_refund", content_type__app_label="testapp"))
    run = durable.start("tests.refund_approval", 25)
    drain()

    log_in(browser, live_server, "ann", "/admin/django_durable/approval/")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Approvals waiting for you"
    inbox = browser.find_element(By.ID, "durable-approvals").text
    assert "Refund 25 EUR?" in inbox and "0 of 1" in inbox
    browser.find_element(By.LINK_TEXT, "Decide").click()
    assert '"amount": 25' in browser.find_element(By.ID, "durable-approval-data").text
    browser.find_element(By.ID, "id_comment").send_keys("within the limit")
    screenshot(browser, "approval.png")
    browser.find_element(By.CSS_SELECTOR, "button[value=approve]").click()
    assert "Approved: Refund 25 EUR?." in browser.find_element(By.CSS_SELECTOR, ".messagelist").text
    assert "Nothing waits for your decision." in browser.find_element(By.ID, "durable-approvals").text
    drain()
    decided = WorkflowRun.objects.get(pk=run.pk)
    assert decided.status == "completed" and decided.get_result()["by"] == ["ann"]
    event = WorkflowEvent.objects.get(run=run, type="approved")
    assert (event.actor, event.message) == ("ann", "within the limit")


def test_a_rows_runs_show_on_its_own_admin_page(browser, live_server, django_user_model):
    from selenium.webdriver.common.by import By

    from tests.testapp.models import Ticket

    django_user_model.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    ticket = Ticket.objects.create(title="printer on fire")
    run = durable.start("tests.ticket_flow", ticket.pk, subject=ticket)
    drain()
    log_in(browser, live_server, "ops", f"/admin/testapp/ticket/{ticket.pk}/change/")
    inline = browser.find_element(By.CSS_SELECTOR, "#durable-workflowrun-content_type-object_id-group, .inline-group")
    assert "WORKFLOW RUNS" in inline.text.upper() and "tests.ticket_flow" in inline.text and "waiting" in inline.text
    assert "triage" in inline.text and "1 of 2" in inline.text
    screenshot(browser, "subject-runs.png")
    inline.find_element(By.LINK_TEXT, run.short_id).click()
    assert run.short_id in browser.find_element(By.TAG_NAME, "h1").text


TRAIL_STYLE = """
    const trail = document.querySelector('.breadcrumbs');
    const link = trail.querySelector('a');
    const pick = (e, names) => Object.fromEntries(names.map(n => [n, getComputedStyle(e)[n]]));
    const box = trail.getBoundingClientRect(), first = link.getBoundingClientRect();
    const second = trail.querySelectorAll('a')[1].getBoundingClientRect();
    return {tag: trail.tagName,
            trail: pick(trail, ['display', 'paddingLeft', 'paddingTop', 'backgroundColor', 'color', 'fontSize',
                                'listStyleType', 'marginLeft']),
            link: pick(link, ['color', 'textDecorationLine', 'display']),
            item: link.parentElement === trail ? null : pick(link.parentElement, ['display', 'listStyleType']),
            left: Math.round(first.left - box.left), height: box.height, gap: second.left - first.right,
            text: trail.innerText.replace(/\\s+/g, ' ').trim()};"""


def test_every_durable_page_draws_its_trail_as_djangos_own_pages_do(browser, live_server, django_user_model):
    """Issue 30: on Django 6.1 the admin's trail is an <ol> of <li>; the durable pages follow the running admin."""
    from django.contrib.auth.models import Permission

    ops = django_user_model.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    ops.user_permissions.add(Permission.objects.get(codename="approve_refund", content_type__app_label="testapp"))
    run = durable.start("tests.three_steps", x=1)
    approval_run = durable.start("tests.refund_approval", 25)
    drain()
    approval = approval_run.approvals.get()
    log_in(browser, live_server, "ops", "/admin/auth/user/")
    django_own = browser.execute_script(TRAIL_STYLE)
    assert django_own["text"].startswith("Home")

    pages = {
        "overview": ("/admin/django_durable/overview/", "Overview"),
        "run page": (f"/admin/django_durable/workflowrun/{run.pk}/change/", "Workflow runs"),
        "start form": ("/admin/django_durable/workflowrun/start/", "Workflow runs"),
        "action form": (f"/admin/django_durable/workflowrun/{run.pk}/do/retry/", "Workflow runs"),
        "inbox": ("/admin/django_durable/approval/", "Approvals"),
        "decide page": (f"/admin/django_durable/approval/{approval.pk}/", "Approvals"),
        "definitions": ("/admin/django_durable/definition/", "Workflow definitions"),
        "definition": ("/admin/django_durable/definition/tests.three_steps/", "tests.three_steps"),
    }
    for name, (path, expected) in pages.items():
        browser.get(f"{live_server.url}{path}")
        ours = browser.execute_script(TRAIL_STYLE)
        assert ours["text"].startswith("Home") and expected in ours["text"], (name, ours["text"])
        assert abs(ours["gap"] - django_own["gap"]) <= 1, (name, ours["gap"], django_own["gap"])  # " › " spacing
        for part in ("tag", "trail", "link", "item", "left"):
            assert ours[part] == django_own[part], (name, part, ours[part], django_own[part])
        assert ours["height"] < 1.5 * django_own["height"], (name, ours, django_own)  # one row, as Django's


def test_a_runs_page_draws_progress_as_progress_and_signals_whole(browser, live_server, django_user_model):
    """Issue 30: a finished run's progress is no 'running' step whose time keeps growing; a signal's payload
    is read whole (not in a 60 px box cut mid-word) and once encoded in the audit trail; the sidebar tells
    the audit trail from the emitted events."""
    from selenium.webdriver.common.by import By

    from tests.testapp.models import Ticket

    django_user_model.objects.create_superuser("ops", "ops@example.com", "a-long-password")
    run = durable.start("tests.ticket_flow", Ticket.objects.create(title="jammed").pk)
    drain()
    durable.signal(run.pk, "resolved", {"by": "customer", "note": "it works again after a restart"}, by="ops")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    log_in(browser, live_server, "ops", f"/admin/django_durable/workflowrun/{run.pk}/change/")
    browser.set_window_size(1400, 1000)

    rows = {row.find_element(By.CSS_SELECTOR, "td:nth-child(2) code").text: row
            for row in browser.find_elements(By.CSS_SELECTOR, "#durable-steps tbody tr")}
    progress = rows["progress"]
    assert not progress.find_elements(By.CSS_SELECTOR, ".durable-running, .durable-cancelled"), progress.text
    assert "1 of 2: triaged" in progress.text
    assert progress.find_element(By.CSS_SELECTOR, "td:nth-child(7)").text == ""  # no duration that grows

    payload = browser.find_element(By.CSS_SELECTOR, "td.durable-payload")
    width = browser.execute_script("return arguments[0].getBoundingClientRect().width", payload)
    assert width >= 180, width
    value = payload.find_element(By.CSS_SELECTOR, ".durable-value")
    assert value.text == '{"by": "customer", "note": "it works again after a restart"}'
    words = browser.execute_script("""
        const range = document.createRange(), node = arguments[0].firstChild, cut = [];
        const text = node.textContent;
        for (const match of text.matchAll(/[^\\s]+/g)) {
          range.setStart(node, match.index); range.setEnd(node, match.index + match[0].length);
          if (range.getClientRects().length > 1) cut.push(match[0]);
        }
        return cut;""", value)
    assert words == [], words  # no word broken across lines
    history = browser.find_element(By.ID, "durable-history").text
    assert '"payload": {"by": "customer"' in history and '\\"by\\"' not in history
    sidebar = browser.find_element(By.ID, "nav-sidebar").text
    assert "Audit trail" in sidebar and "Emitted events" in sidebar and "Workflow events" not in sidebar


def test_a_runs_graph_follows_it_live_and_opens_its_child(browser, live_server, django_user_model):
    from selenium.webdriver.common.by import By

    run = durable.start("tests.graph_live", n=12)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    _login(browser, live_server, django_user_model)
    browser.get(f"{live_server.url}/admin/django_durable/workflowrun/{run.pk}/change/")

    def keys():
        return browser.execute_script(
            "return [...document.querySelectorAll('#durable-graph g.durable-node')].map("
            "g => g.dataset.key + ' ' + g.getAttribute('class').split(' ').pop());")

    assert keys() == ["start durable-node-completed", "prepare durable-node-completed",
                      "signal:go:0 durable-node-waiting"]
    browser.execute_script("window.durableSamePage = true;")  # gone if the page were loaded again

    # The run goes on in another process's worker (here: this test's); the page draws it as it goes.
    durable.signal(run.pk, "go")
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "completed"
    wait_for(lambda: "completed durable-node-completed" in keys(), timeout=60, interval=0.2,
             message="the graph drawn again after the run ended")
    report = browser.find_element(By.CSS_SELECTOR, "#durable-graph a g[data-key='report']")
    # The event stream's end draws the graph once more, the same as shown: the page is left alone,
    # and the box found before it is still the one on the page.
    wait_for(lambda: browser.execute_script("return document.getElementById('durable-graph').dataset.live") == "ended",
             timeout=60, interval=0.1, message="the live graph to stop at the event stream's end")
    assert keys() == ["start durable-node-completed", "prepare durable-node-completed",
                      "signal:go:0 durable-node-completed", "12 completed durable-node-completed",
                      "report durable-node-completed", "completed durable-node-completed"]
    assert browser.execute_script("return window.durableSamePage === true")
    assert "of 12 branches of square" in browser.find_element(By.ID, "durable-graph").get_attribute("innerHTML")
    browser.set_window_size(1400, 1100)
    browser.execute_script("document.getElementById('durable-graph').scrollIntoView();")
    screenshot(browser, "run-graph.png")

    # The child's box opens the child's page, with its own graph.
    child = WorkflowRun.objects.get(parent=run)
    report.click()
    wait_for(lambda: str(child.pk) in browser.current_url, timeout=60, interval=0.1, message="the child's page")
    assert keys() == ["start durable-node-completed", "a durable-node-completed", "b durable-node-completed",
                      "c durable-node-completed", "completed durable-node-completed"]
