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

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture
def browser():
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
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


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
    browser.get(f"{live_server.url}/admin/login/?next=/admin/django_durable/overview/")
    browser.find_element(By.NAME, "username").send_keys("ops")
    browser.find_element(By.NAME, "password").send_keys("a-long-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()

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
    rows = {row.find_element(By.CSS_SELECTOR, "td.field-workflow").text: row
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
