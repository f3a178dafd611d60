"""The example shop (`make demo`) clicked through in a real headless Chromium: an order whose
checkout shows its progress live, a refund a person approves, a declined card undone by the saga,
and the image fan-out. The demo runs as `make demo` starts it (scripts/demo.sh: a worker and the
development server on a SQLite file of its own). With DURABLE_SCREENSHOTS=<dir> the test saves
the order page the README shows.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ON_POSTGRES, ROOT, wait_for
from tests.test_admin_browser import browser, screenshot  # noqa: F401 (the fixture)
from tests.test_demo import free_port

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.timeout(300),
              pytest.mark.skipif(ON_POSTGRES, reason="the demo runs on SQLite")]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    """The demo's directory: its database, its log, and the file the support agent's stand-in
    model waits for (SUPPORT_HOLD) half-way through an answer."""
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def demo(demo_dir):
    """The demo's base URL, running until the module's tests end (started once: ~20 s)."""
    tmp_path = demo_dir
    port = free_port()
    env = {**os.environ, "PORT": str(port), "DEMO_DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
           "PY": sys.executable, "SUPPORT_HOLD": str(tmp_path / "support-go")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = open(tmp_path / "demo.log", "w")
    process = subprocess.Popen([str(ROOT / "scripts" / "demo.sh")], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while "demo is running" not in (tmp_path / "demo.log").read_text():
            assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "demo.log").read_text()
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}"
    finally:
        try:
            os.killpg(process.pid, signal.SIGINT)
            process.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(process.pid, signal.SIGKILL)
        log.close()


def place_order(driver, base, product: str, card: str) -> int:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver.get(base + "/")
    Select(driver.find_element(By.NAME, "product")).select_by_value(product)
    quantity = driver.find_element(By.NAME, "quantity")
    quantity.clear()
    quantity.send_keys("2")
    driver.find_element(By.CSS_SELECTOR, f"input[name=card][value={card}]").click()
    driver.find_element(By.CSS_SELECTOR, "#order-form button").click()
    wait_for(lambda: re.search(r"/orders/(\d+)/$", driver.current_url), timeout=60, interval=0.25, message="the order's page")
    return int(re.search(r"/orders/(\d+)/$", driver.current_url)[1])


def ended(driver) -> str:
    """The run's end as the order page's script saw it over the REST API, or ""."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.ID, "run-outcome").get_attribute("data-ended") or ""
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def log_in(browser, demo) -> None:
    """Through the shop's link, as the demo says."""
    from selenium.webdriver.common.by import By

    browser.get(demo + "/")
    browser.find_element(By.LINK_TEXT, "Log in").click()
    browser.find_element(By.NAME, "username").send_keys("demo")
    browser.find_element(By.NAME, "password").send_keys("demo")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: browser.find_elements(By.ID, "order-form"), timeout=60, interval=0.25, message="the shop's order form")


def test_a_visitor_clicks_through_the_shop(browser, demo):  # noqa: F811 (the fixture)
    from selenium.webdriver.common.by import By

    log_in(browser, demo)

    # An order: the page follows the checkout live, through the run's server-sent events.
    order = place_order(browser, demo, "tee", "ok")
    assert browser.find_element(By.ID, "checkout").get_attribute("data-source") == "stream"
    seen = set()

    def watched():  # the end first: once the page has it, it has every step the stream sent before it
        end = ended(browser)
        text = browser.find_element(By.ID, "checkout").text if browser.find_elements(By.ID, "checkout") else ""
        seen.update(re.findall(r"(reserve|charge|ship|receipt): (completed|running)", text))
        return end

    assert wait_for(watched, timeout=60, interval=0.25, message="the checkout to end") == "completed"
    assert {("reserve", "completed"), ("charge", "completed"), ("ship", "completed"),
            ("receipt", "completed")} <= seen, seen
    assert "Tracking: TRACK-" in browser.find_element(By.ID, "run-outcome").text
    assert browser.find_element(By.ID, "run-bar").get_attribute("style").endswith("width: 100%;")

    # The receipt: a child workflow handed the e-mail to a django.tasks task; the page reloads itself.
    def receipt():  # a fresh load each time: the page's own reload is then not pending
        browser.get(f"{demo}/orders/{order}/")
        return f"Your receipt for order {order}" in browser.find_element(By.ID, "emails").text

    wait_for(receipt, timeout=30, interval=0.25, message="the receipt e-mail")
    assert browser.find_element(By.ID, "order-status").text == "shipped"
    if os.environ.get("DURABLE_SCREENSHOTS"):
        wait_for(lambda: ended(browser), timeout=60, interval=0.25, message="the page's one look at the run")
        time.sleep(0.5)  # the progress bar's transition
        screenshot(browser, "shop-order.png")

    # A refund: asked on the order's page, approved by a person on the home page.
    browser.find_element(By.XPATH, "//button[text()='Ask for a refund']").click()
    wait_for(lambda: "waits for approval" in browser.page_source, timeout=30, interval=0.25, message="the refund to be asked for")
    def awaiting():
        browser.get(demo + "/")
        return [f for f in browser.find_elements(By.CSS_SELECTOR, "form[action^='/refunds/']") if f"(order {order})" in f.text]

    form = wait_for(awaiting, timeout=60, interval=0.25, message="the refund to wait for a decision")[0]
    form.find_element(By.NAME, "comment").send_keys("damaged in transit")
    form.find_element(By.CSS_SELECTOR, "button[value=approve]").click()
    wait_for(lambda: "Refund approved." in browser.page_source, timeout=30, interval=0.25, message="the approval to be taken")

    def refunded():
        browser.get(f"{demo}/orders/{order}/")
        return browser.find_element(By.ID, "order-status").text == "refunded"

    wait_for(refunded, timeout=30, interval=0.25, message="the refund to be paid")

    # A declined card: the charge fails for good and the saga releases the reservation.
    declined = place_order(browser, demo, "mug", "declined")
    assert wait_for(lambda: ended(browser), timeout=60, interval=0.25, message="the declined checkout to end") == "failed"
    assert "The card was declined." in browser.find_element(By.ID, "run-outcome").text
    assert "rollback:reserve: completed (undone)" in browser.find_element(By.ID, "run-steps").text

    def cancelled():
        browser.get(f"{demo}/orders/{declined}/")
        return browser.find_element(By.ID, "order-status").text == "cancelled"

    wait_for(cancelled, timeout=30, interval=0.25, message="the order to be released")

    # The fan-out: nine branches, shown on the run's page in the admin.
    browser.get(demo + "/")
    browser.find_element(By.XPATH, "//button[text()='Render product images']").click()
    wait_for(lambda: "/admin/django_durable/workflowrun/" in browser.current_url, timeout=30, interval=0.25, message="the run's page")

    def rendered():
        browser.refresh()
        return "Status\ncompleted" in browser.find_element(By.ID, "content").text

    wait_for(rendered, timeout=60, interval=0.25, message="the images to be rendered")
    assert "render:8" in browser.page_source


def test_the_support_agents_answer_arrives_word_by_word_while_the_model_writes_it(browser, demo, demo_dir):  # noqa: F811
    """A customer asks the support agent for a refund: the agent looks the order up (a tool), asks
    for the refund (a tool that waits for someone with orders.approve_refund), and its answer
    reaches the ticket's page while the model's request is still running (the stand-in model stops
    half-way through its answer until the test lets it go on)."""
    from selenium.webdriver.common.by import By

    log_in(browser, demo)
    order = place_order(browser, demo, "poster", "ok")
    assert wait_for(lambda: ended(browser), timeout=60, interval=0.25, message="the checkout to end") == "completed"

    def shipped():
        browser.get(f"{demo}/orders/{order}/")
        return browser.find_element(By.ID, "order-status").text == "shipped"

    wait_for(shipped, timeout=60, interval=0.25, message="the order to ship")
    browser.find_element(By.NAME, "question").send_keys("The poster arrived torn, I would like a refund.")
    browser.find_element(By.CSS_SELECTOR, "#support-form button").click()
    wait_for(lambda: "/support/" in browser.current_url, timeout=30, interval=0.25, message="the ticket's page")
    ticket = browser.current_url
    wait_for(lambda: "waiting for someone allowed to approve refunds" in browser.find_element(By.ID, "ticket").text,
             timeout=90, interval=0.25, message="the refund tool to wait for approval")
    assert "looked the order up: completed" in browser.find_element(By.ID, "run-steps").text

    # The approval, on the home page, as someone with the permission (the demo user is a superuser).
    def awaiting():
        browser.get(demo + "/")
        return [f for f in browser.find_elements(By.CSS_SELECTOR, "form[action^='/refunds/']")
                if f"refund_order(order_id={order})" in f.text]

    wait_for(awaiting, timeout=30, interval=0.25, message="the agent's refund to wait for a decision")[0].find_element(
        By.CSS_SELECTOR, "button[value=approve]").click()
    wait_for(lambda: "Refund approved." in browser.page_source, timeout=30, interval=0.25, message="the approval")

    # Half of the answer on the page while the model's request still runs (held), then the rest.
    browser.get(ticket)
    answer = lambda: browser.find_element(By.ID, "answer")  # noqa: E731
    wait_for(lambda: int(answer().get_attribute("data-tokens")) >= 5, timeout=90, interval=0.1,
             message="the first words of the answer")
    partial = answer().text
    assert "About the refund" not in partial and answer().get_attribute("data-ended") is None, partial
    assert browser.find_element(By.ID, "ticket").get_attribute("data-ended") is None
    (demo_dir / "support-go").touch()
    assert wait_for(lambda: browser.find_element(By.ID, "ticket").get_attribute("data-ended"), timeout=60,
                    interval=0.25, message="the answer to end") == "completed"
    text = answer().text
    assert text.startswith(partial) and "About the refund: refunded in full." in text, text
    assert int(answer().get_attribute("data-ended")) == int(answer().get_attribute("data-tokens"))  # all before the step ended
    browser.get(f"{demo}/orders/{order}/")
    assert browser.find_element(By.ID, "order-status").text == "refunded"
    if os.environ.get("DURABLE_SCREENSHOTS"):
        browser.get(ticket)
        wait_for(lambda: browser.find_element(By.ID, "ticket").get_attribute("data-ended"), timeout=30, interval=0.25,
                 message="the ticket's page")
        screenshot(browser, "shop-support.png")
