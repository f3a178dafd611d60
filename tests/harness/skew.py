"""A wrong wall clock for a worker process (RELIABILITY T22), set by DURABLE_TEST_CLOCK_SKEW.

"600" runs this process's clock 10 minutes ahead, "-600" behind; "0@2:-600" starts right and
jumps back 10 minutes two seconds after start-up. Only the wall clock moves (time.time and
Django's timezone.now), as when NTP is wrong or steps it; monotonic time is untouched.
"""

import datetime as dt
import time


def install(spec: str) -> None:
    from django.utils import timezone

    first, _, later = spec.partition("@")
    after, _, jumped = later.partition(":")
    skew, after, jumped = float(first), float(after) if after else None, float(jumped) if jumped else None
    started = time.monotonic()
    real_now, real_time = timezone.now, time.time

    def current() -> float:
        if after is not None and time.monotonic() - started >= after:
            return jumped
        return skew

    timezone.now = lambda: real_now() + dt.timedelta(seconds=current())
    time.time = lambda: real_time() + current()
