"""The engine's own CPU per step, in-process: drain ten-step workflows and count process time.

    DATABASE_URL=postgres://... python bench/cpu.py [--root DIR] [--runs 200] [--repeat 5]

The harness's throughput figures move by about 10% with the machine; CPU time spent by the
process that replays and records steps moves far less, so two versions of the engine compare
here even on a busy machine. `--root` measures the checkout in DIR (a git worktree of an older
commit, say) with this script; it prints the best of --repeat drains, in microseconds per step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, str(args.root.resolve()))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    import django_durable as durable
    from django_durable.testing import drain

    call_command("migrate", verbosity=0)
    print(f"measuring {Path(durable.__file__).parent}", file=sys.stderr)
    best = float("inf")
    for _ in range(args.repeat):
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE durable_step, durable_work_item, durable_timer, durable_signal, "
                           "durable_workflow_event, durable_workflow_run CASCADE")
        for _ in range(args.runs):
            durable.start("bench.ten_steps", n=10)
        started = time.process_time()
        drain()
        best = min(best, time.process_time() - started)
    print(f"{1e6 * best / (args.runs * 10):.1f}")


if __name__ == "__main__":
    main()
