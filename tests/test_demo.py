"""`make demo`'s script: a worker, the server and example runs on SQLite; Ctrl-C stops it all."""

import base64
import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from tests.conftest import ON_POSTGRES, ROOT
from tests.harness import free_port

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ON_POSTGRES, reason="the demo runs on SQLite")]


def test_the_demo_runs_the_examples_and_stops_everything_on_ctrl_c(tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "PORT": str(port),
        "DEMO_DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "PY": sys.executable,
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = open(tmp_path / "demo.log", "w")
    demo = subprocess.Popen(
        [str(ROOT / "scripts" / "demo.sh")], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        page = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read().decode()
            except OSError:
                page = ""
            if page.count("<td>completed</td>") == 7 and page.count("<td>failed</td>") == 2 \
                    and page.count("<td>waiting</td>") == 1:  # the refund reached its wait, after the others
                break
            time.sleep(0.3)
        output = (tmp_path / "demo.log").read_text()
        # Two checkouts with their receipts and e-mail tasks, and the word count; a declined card's
        # checkout and the example that fails; the refund waits for a person.
        assert page.count("<td>completed</td>") == 7, output
        assert page.count("<td>failed</td>") == 2, page
        assert page.count("<td>waiting</td>") == 1, re.findall(r"<td>(pending|running|waiting)</td>", page)

        # A visitor may not decide: the page asks to log in. The demo user (who may approve refunds)
        # logs in, and approves it through the page's form.
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        page = browser.open(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
        assert "to decide refunds" in page and '<form method="post"' not in page
        page = log_in(browser, port, "/")
        assert "Refund 23.00 to " in page
        action = re.search(r'<form method="post" action="(/refunds/[^"]+)">', page).group(1)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "decision": "approve"}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}{action}", data=body,
                                         headers={"Referer": f"http://127.0.0.1:{port}/"})
        assert "Refund approved." in browser.open(request, timeout=5).read().decode()
        deadline = time.monotonic() + 30
        while page.count("<td>completed</td>") < 8 and time.monotonic() < deadline:
            time.sleep(0.3)
            page = browser.open(f"http://127.0.0.1:{port}/", timeout=5).read().decode()
        assert page.count("<td>completed</td>") == 8
        assert "demo / demo" in output
        assert f"http://127.0.0.1:{port}/admin/django_durable/overview/" in output

        # The operator's overview, logged in as the demo user: the demo's worker reports itself.
        overview = log_in(browser, port, "/admin/django_durable/overview/")
        assert "Runs by queue" in overview and re.search(r"[1-9] live", overview)
        assert 'class="durable-banner"' not in overview
        # The API, with the demo user's credentials as the README's curl lines use them.
        api = urllib.request.Request(f"http://127.0.0.1:{port}/api/durable/workflows/?status=completed")
        api.add_header("Authorization", "Basic " + base64.b64encode(b"demo:demo").decode())
        listed = json.loads(urllib.request.urlopen(api, timeout=5).read())
        assert listed["results"] and all(run["status"] == "completed" for run in listed["results"])

        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        # Bounded generously: the subject is that everything stops, not how fast a loaded machine
        # lets it (a step in flight may take the worker's shutdown grace).
        try:
            demo.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"The demo did not stop within 90 s of Ctrl-C. Its log:\n{(tmp_path / 'demo.log').read_text()}")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.killpg(demo.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        with pytest.raises(ProcessLookupError):
            os.killpg(demo.pid, 0)  # no process of the demo is left
    finally:
        try:
            os.killpg(demo.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()


def log_in(browser, port, next_path: str) -> str:
    """Log in as the demo user through the admin's form; return the page it goes on to."""
    login = f"http://127.0.0.1:{port}/admin/login/?next={next_path}"
    form = browser.open(login, timeout=5).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    body = urllib.parse.urlencode({"csrfmiddlewaretoken": token, "username": "demo", "password": "demo",
                                   "next": next_path}).encode()
    return browser.open(urllib.request.Request(login, data=body, headers={"Referer": login}), timeout=5).read().decode()
