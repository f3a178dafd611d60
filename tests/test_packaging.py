"""The built wheel: it carries the migrations and commands, and works in a fresh environment."""

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ON_POSTGRES, ROOT

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(ON_POSTGRES, reason="packaging does not depend on the database; run once"),
]


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)])
    (path,) = out.glob("django_durable_workflows-*.whl")
    return path


def test_the_wheel_holds_the_package_its_migrations_and_commands(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "django_durable/migrations/0001_initial.py" in names
    assert "django_durable/management/commands/durable_worker.py" in names
    assert "django_durable/engine/replay.py" in names
    assert "django_durable/templates/admin/django_durable/includes/shape.html" in names
    assert "django_durable/py.typed" in names  # the API's annotations are for type checkers
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), sorted(names)[-8:]
    assert not any(name.startswith(("tests/", "example_project/")) for name in names)


def test_the_sdist_and_the_wheel_pass_the_index_strict_metadata_check(tmp_path):
    """What the package index would say: both built from the checkout, their metadata (the README
    as the long description, the license) checked strictly by twine; the sdist carries the license
    and the changelog."""
    import tarfile

    run([sys.executable, "-m", "build", "--outdir", str(tmp_path), str(ROOT)])
    built = sorted(tmp_path.glob("django_durable_workflows-*"), key=lambda path: path.suffix)
    assert [path.suffix for path in built] == [".gz", ".whl"], built
    out = run([sys.executable, "-m", "twine", "check", "--strict", *map(str, built)])
    assert out.count("PASSED") == 2, out
    metadata = zipfile.ZipFile(built[1]).read(next(
        name for name in zipfile.ZipFile(built[1]).namelist() if name.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: BSD-3-Clause" in metadata and "License-File: LICENSE" in metadata
    assert "Classifier: Typing :: Typed" in metadata
    with tarfile.open(built[0]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"LICENSE", "CHANGELOG.md", "README.md", "django_durable/py.typed"} <= names, sorted(names)[:20]


def test_the_wheel_installs_and_runs_a_workflow_in_a_fresh_environment(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    run([str(python), "-m", "pip", "install", "--quiet", str(wheel)])

    project = tmp_path / "project"
    (project / "shop").mkdir(parents=True)
    (project / "shop" / "__init__.py").write_text("")
    (project / "shop" / "workflows.py").write_text(textwrap.dedent('''
        import django_durable as durable

        def double(x):
            return x * 2

        @durable.workflow("shop.double_twice")
        def double_twice(ctx, x):
            return ctx.step("second", double, ctx.step("first", double, x))
    '''))
    (project / "settings.py").write_text(textwrap.dedent(f'''
        SECRET_KEY = "x"
        USE_TZ = True
        INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_durable", "shop"]
        DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3",
                                  "NAME": "{tmp_path / 'db.sqlite3'}",
                                  "OPTIONS": {{"transaction_mode": "IMMEDIATE",
                                              "init_command": "PRAGMA journal_mode=WAL;"}}}}}}
    '''))
    env = {**os.environ, "PYTHONPATH": str(project), "DJANGO_SETTINGS_MODULE": "settings"}
    env.pop("DURABLE_TEST_DATABASE_URL", None)

    def django_admin(*args):
        return run([str(python), "-m", "django", *args], cwd=project, env=env)

    assert "durable_worker" in django_admin("help")
    django_admin("migrate", "--noinput")
    django_admin("check", "--database", "default", "--fail-level", "WARNING")
    started = run(
        [str(python), "-c", "import django; django.setup(); import django_durable as d; "
         "print(d.start('shop.double_twice', 5).pk)"],
        cwd=project, env=env,
    ).strip()
    django_admin("durable_worker", "--burst", "--concurrency", "1")
    result = run(
        [str(python), "-c", f"import django; django.setup(); import django_durable as d; print(d.wait('{started}', timeout=5))"],
        cwd=project, env=env,
    )
    assert result.strip() == "20"
    installed = Path(run([str(python), "-c", "import django_durable, os; print(os.path.dirname(django_durable.__file__))"], cwd=project, env=env).strip())
    assert str(installed).startswith(str(venv))
