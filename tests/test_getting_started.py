"""docs/getting-started.md, followed word for word in a new Django project (not the example
project): on SQLite, and on PostgreSQL when the suite runs there.

Every console block of the page marked `<!-- runnable -->` is run as written, in order, in a new
directory (`python` and `django-admin` are this environment's); blocks marked
`<!-- runnable: background -->` (the worker, the development server) are started and left running
until the end. The files the page shows (kept identical to docs/getting_started/ by test_docs_examples) go where the page says. Then
what the page promises is checked: the result printed, the admin's list and run page, the REST
API with basic authentication, and a worker stopped during the sleep not running a step twice.
"""

from __future__ import annotations

import base64
import http.cookiejar
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import ON_POSTGRES, ROOT, wait_for
from tests.harness import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PAGE = ROOT / "docs" / "getting-started.md"
FILES = ROOT / "docs" / "getting_started"
BLOCK = re.compile(r"<!-- runnable(?P<background>: background)? -->\n```console\n(?P<body>.*?)```", re.S)


def runnable_blocks() -> list[tuple[bool, list[str]]]:
    """(in the background?, the commands) of each runnable block, in the page's order."""
    blocks = []
    for match in BLOCK.finditer(PAGE.read_text()):
        commands = [line[2:] for line in match["body"].splitlines() if line.startswith("$ ")]
        blocks.append((bool(match["background"]), commands))
    return blocks


def test_the_page_marks_the_commands_a_new_user_runs():
    blocks = runnable_blocks()
    assert [background for background, _ in blocks] == [False, False, True, False, False, True]
    assert "django-admin startproject mysite ." in blocks[0][1]
    assert blocks[2][1] == ["python manage.py durable_worker"]
    for name in ("settings_sqlite.py", "settings_postgres.py", "urls.py", "shop/workflows.py", "start.py"):
        assert f"<!-- file: docs/getting_started/{name} -->" in PAGE.read_text(), name


class Project:
    """A new directory where the page's commands run, with what they started."""

    def __init__(self, path: Path, env: dict):
        self.path, self.env, self.background = path, env, []
        self.port = free_port()

    def argv(self, command: str) -> tuple[list[str], dict, str | None]:
        """The command as a list, its extra environment, and the file its stdin comes from."""
        env, stdin = {}, None
        if "<" in command:
            command, stdin = (part.strip() for part in command.split("<", 1))
        words = shlex.split(command)
        while "=" in words[0] and not words[0].startswith("-"):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        bindir = Path(sys.executable).parent
        if words[0] == "python":
            words[0] = sys.executable
        elif words[0] == "django-admin":
            words[0] = str(bindir / "django-admin")
        if words[-1] == "runserver":
            words += [f"127.0.0.1:{self.port}", "--noreload"]
        return words, env, stdin

    def run(self, command: str) -> str:
        words, env, stdin = self.argv(command)
        with open(self.path / stdin) if stdin else open(os.devnull) as source:
            done = subprocess.run(words, cwd=self.path, env={**self.env, **env}, stdin=source, capture_output=True,
                                  text=True, timeout=120)
        assert done.returncode == 0, f"$ {command}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, command: str) -> subprocess.Popen:
        words, env, _ = self.argv(command)
        log = open(self.path / f"background-{len(self.background)}.log", "w")
        process = subprocess.Popen(words, cwd=self.path, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT)
        self.background.append(process)
        return process

    def stop(self, process: subprocess.Popen, how=signal.SIGTERM) -> None:
        process.send_signal(how)
        process.wait(timeout=60)

    def close(self) -> None:
        for process in self.background:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)

    def shell(self, code: str) -> str:
        return self.run(f"python manage.py shell --no-imports -c {shlex.quote(code)}")


@pytest.fixture
def database():
    """The settings file of the page for this suite's database, and the environment it reads."""
    if not ON_POSTGRES:
        yield "settings_sqlite.py", {}
        return
    import psycopg

    server = os.environ["DURABLE_TEST_DATABASE_URL"]
    name = f"mysite_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    parts = urllib.parse.urlsplit(server)
    try:
        yield "settings_postgres.py", {"PGDATABASE": name, "PGUSER": parts.username or "postgres",
                                       "PGPASSWORD": parts.password or "", "PGHOST": parts.hostname,
                                       "PGPORT": str(parts.port or 5432)}
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_a_new_user_follows_the_page_to_a_completed_workflow_seen_in_the_admin_and_over_http(tmp_path, database):
    settings_file, db_env = database
    env = {key: value for key, value in os.environ.items() if not key.startswith(("DJANGO_", "DURABLE_"))}
    env.update(db_env, PYTHONPATH="")
    project = Project(tmp_path, env)
    blocks = iter(runnable_blocks())
    try:
        # 2. A project and an app.
        for command in next(blocks)[1]:
            project.run(command)
        # 3. Settings and URLs, appended where the page says.
        with open(tmp_path / "mysite" / "settings.py", "a") as settings:
            settings.write("\n" + (FILES / settings_file).read_text())
        with open(tmp_path / "mysite" / "urls.py", "a") as urls:
            urls.write("\n" + (FILES / "urls.py").read_text())
        for command in next(blocks)[1]:
            project.run(command)
        # 4. The workflow, and start.py beside manage.py.
        (tmp_path / "shop" / "workflows.py").write_text((FILES / "shop" / "workflows.py").read_text())
        (tmp_path / "start.py").write_text((FILES / "start.py").read_text())
        # 5. A worker, a run from the shell, a run from the command line.
        _, (worker_command,) = next(blocks)
        worker = project.start(worker_command)
        printed = project.run(next(blocks)[1][0])
        assert "{'order': 1, 'receipt': 'Receipt for order 1: 12.50 paid.'}" in printed, printed
        first_id = re.search(r"([0-9a-f-]{36}) pending", printed)[1]
        cli = project.run(next(blocks)[1][0])
        assert "Receipt for order 2: 9.90 paid." in cli, cli

        # "Now stop the worker during the sleep": Ctrl-C, start it again, nothing run twice.
        run_id = project.shell("import django_durable as d; print(d.start('shop.checkout', order_id=3, cents=100).id)").strip()
        status = "from django_durable.models import WorkflowRun as R; print(R.objects.get(pk=%r).status)" % run_id
        wait_for(lambda: project.shell(status).strip() == "waiting", timeout=60, interval=0.25, message="the run to sleep")
        project.stop(worker, signal.SIGINT)
        assert worker.returncode == 0, (tmp_path / "background-0.log").read_text()
        project.start(worker_command)
        wait_for(lambda: project.shell(status).strip() == "completed", timeout=60, interval=0.25, message="the run to finish after the restart")
        attempts = json.loads(project.shell(
            "import json; from django_durable.models import Step; print(json.dumps(dict("
            f"Step.objects.filter(run_id={run_id!r}).values_list('key', 'attempts'))))"))
        assert attempts == {"reserve": 1, "charge": 1, "cooling-off": 1, "receipt": 1}, attempts

        # 6. The admin, through its login form.
        _, (server_command,) = next(blocks)
        project.start(server_command)
        base = f"http://127.0.0.1:{project.port}"
        wait_for(lambda: _reachable(base + "/admin/login/"), timeout=60, interval=0.25, message="the development server")
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        login = browser.open(base + "/admin/login/", timeout=30).read().decode()
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login)[1]
        form = urllib.parse.urlencode({"username": "admin", "password": "change-me", "csrfmiddlewaretoken": token,
                                       "next": "/admin/django_durable/workflowrun/"}).encode()
        runs_page = browser.open(urllib.request.Request(base + "/admin/login/?next=/admin/django_durable/workflowrun/",
                                                        data=form, headers={"Referer": base + "/admin/login/"}),
                                 timeout=30).read().decode()
        assert "shop.checkout" in runs_page and "Completed" in runs_page, runs_page[:2000]
        run_page = browser.open(f"{base}/admin/django_durable/workflowrun/{first_id}/change/", timeout=30).read().decode()
        for key in ("reserve", "charge", "cooling-off", "receipt"):
            assert key in run_page, key

        # 7. The REST API with basic authentication, as the page's curl does.
        auth = {"Authorization": "Basic " + base64.b64encode(b"admin:change-me").decode()}
        answer = json.load(urllib.request.urlopen(urllib.request.Request(
            f"{base}/api/durable/workflows/{first_id}/", headers=auth), timeout=30))
        assert (answer["workflow"], answer["status"], answer["result"]["order"]) == ("shop.checkout", "completed", 1)
        try:  # a stranger is asked to authenticate, as HTTP says (401 with a challenge), not refused
            urllib.request.urlopen(f"{base}/api/durable/workflows/{first_id}/", timeout=30)
            raise AssertionError("the API answered a stranger")
        except urllib.error.HTTPError as refused:
            assert refused.code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic"), refused.headers

        # The health probe the README and the production page name, where they name it.
        try:
            health = urllib.request.urlopen(f"{base}/durable/health/?probe=ready", timeout=30)
        except urllib.error.HTTPError as unhealthy:
            health = unhealthy
        assert health.headers["Content-Type"] == "application/json" and json.load(health)["probe"] == "ready"
    finally:
        project.close()


def _reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2).read()
        return True
    except OSError:
        return False
