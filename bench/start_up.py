"""How long a worker takes from its spawn to its first claim, and what its start-up costs.

    DATABASE_URL=postgres://... .venv/bin/python bench/start_up.py [--repeat 5] [--worker-settings MODULE]

Each repeat enqueues one task, spawns `manage.py durable_worker --burst -c 1` (bench.settings: the
admin, the REST framework and django.tasks installed, as a project has them) and reads when the
task's run started, by the database's clock, on this machine: spawn to first claim. Then the
worker's whole life (start, one task, exit): its CPU and its peak RSS. The medians are printed, and
for reference how long `python -c "import django; django.setup()"` with the same settings takes from
its spawn until setup returns; with the same settings less django-durable and the benchmark app
(what any worker of such a project pays before it can claim); and with only the two Django apps
django-durable needs, contenttypes and auth (what any Django process with django-durable pays,
whatever its project).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import run as harness  # noqa: E402  (sets Django up on bench.settings)
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections  # noqa: E402


def once(worker_settings: str) -> dict:
    from bench.benchapp.tasks import one_step

    harness.truncate()
    run_id = one_step.enqueue(0).id
    connections.close_all()
    spawned = time.time()
    # Through GNU time: its own small process starts the worker, so the worker's peak RSS is its
    # own (a child of this Django process would carry this process's pages until its exec).
    done = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", *harness.worker_command("--burst", "-c", "1", "-v", "0")],
                          env=harness.worker_env(DJANGO_SETTINGS_MODULE=worker_settings), check=True,
                          capture_output=True, text=True)
    peak_kb, user, system = done.stderr.split()[-3:]
    return {"first_claim_s": harness.started_at(run_id) - spawned,
            "cpu_s": float(user) + float(system), "peak_rss_mb": int(peak_kb) / 1024}


def django_alone(installed_apps: list[str] | None = None) -> float:
    """Spawn to the end of `django.setup()` in a process of its own, by the clock the child reads
    when setup returns: its exit (some 0.14 s here, a collection of everything setup made) is not
    part of a start, as it is not part of the worker's spawn to first claim. `installed_apps`, if
    given, replaces bench.settings' INSTALLED_APPS in the child before setup."""
    code = f"import bench.settings as s; s.INSTALLED_APPS[:] = {installed_apps!r}; " if installed_apps else ""
    code += "import django, time; django.setup(); print(time.time())"
    spawned = time.time()
    done = subprocess.run([sys.executable, "-c", code], env=harness.worker_env(), cwd=harness.ROOT,
                          check=True, capture_output=True, text=True)
    return float(done.stdout.split()[-1]) - spawned  # (the last line: what settings print goes before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--worker-settings", default="bench.settings",
                        help="the workers' settings module (bench.worker_settings: the project less the apps "
                        "that only serve requests, as docs/workers.md advises)")
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    runs = [once(args.worker_settings) for _ in range(args.repeat)]
    without_durable = [app for app in settings.INSTALLED_APPS if app not in ("django_durable", "bench.benchapp")]
    alone = statistics.median(django_alone() for _ in range(args.repeat))
    bare = statistics.median(django_alone(without_durable) for _ in range(args.repeat))
    least = statistics.median(django_alone(["django.contrib.contenttypes", "django.contrib.auth"])
                              for _ in range(args.repeat))
    for key, label in (("first_claim_s", "spawn to first claim"), ("cpu_s", "CPU of its whole life"),
                       ("peak_rss_mb", "peak RSS (MB)")):
        values = [r[key] for r in runs]
        print(f"{label:28} median {statistics.median(values):6.2f}   ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"{'django.setup() alone':28} median {alone:6.2f} s (spawn to setup's return, a process of its own)")
    print(f"{'  without django-durable':28} median {bare:6.2f} s (the same, django-durable's apps left out)")
    print(f"{'  contenttypes and auth only':28} median {least:6.2f} s (the same, no other app installed)")


if __name__ == "__main__":
    main()
