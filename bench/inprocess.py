"""Set-up shared by the in-process measurements (cpu.py, start.py): Django for a checkout."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

TABLES = ("durable_step, durable_work_item, durable_timer, durable_signal, durable_workflow_event, "
          "durable_workflow_run")


def parser(doc: str) -> argparse.ArgumentParser:
    """The arguments every such script takes: --root, the checkout to measure."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    return parser


def set_up(root: Path):
    """Django set up with the django_durable of `root`, its tables migrated and emptied; return it."""
    sys.path.insert(0, str(root.resolve()))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from django.core.management import call_command

    import django_durable as durable

    call_command("migrate", verbosity=0)
    print(f"measuring {Path(durable.__file__).parent}", file=sys.stderr)
    empty()
    return durable


def empty() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLES} CASCADE")
