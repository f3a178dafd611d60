"""`make demo`'s script: a worker, the server and example runs on SQLite; Ctrl-C stops it all."""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.conftest import ON_POSTGRES, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.skipif(ON_POSTGRES, reason="the demo runs on SQLite")]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            if page.count("<td>completed</td>") == 4 and page.count("<td>failed</td>") == 1:
                break
            time.sleep(0.3)
        output = (tmp_path / "demo.log").read_text()
        assert page.count("<td>completed</td>") == 4, output
        assert "demo / demo" in output
        assert f"http://127.0.0.1:{port}/admin/django_durable/workflowrun/" in output

        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        demo.wait(timeout=30)
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
