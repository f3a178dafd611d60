"""A worker's start-up: the cyclic garbage collector held off while Django loads the project.

Loading a project's apps, models and admin modules makes some 90,000 objects that live as long as
the process, and while they are made the collector walks the growing heap again and again (about
180 collections, one of them full, with the admin, the REST framework and django.tasks installed:
a tenth of a worker's start). ``manage.py durable_worker`` holds it off from the moment Django
imports this package until the worker freezes what start-up made (``gc.freeze()``, just before
its loop), then turns it back on; the cyclic garbage of the imports is frozen with the rest. Other
processes (the web server, other commands, tests) are left alone.
"""

from __future__ import annotations

import gc
import sys

_held = False


def hold_collector() -> None:
    """Turn the collector off if this process is starting a worker (and it was on)."""
    global _held
    if sys.argv[1:2] == ["durable_worker"] and gc.isenabled():
        gc.disable()
        _held = True


def release_collector() -> None:
    """Turn the collector back on if hold_collector() turned it off."""
    global _held
    if _held:
        _held = False
        gc.enable()
