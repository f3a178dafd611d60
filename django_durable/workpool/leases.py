"""How long a claim lasts: the lease a claim or a heartbeat sets, on the database's clock."""

from __future__ import annotations

import datetime as dt

from django.db.models import DateTimeField, ExpressionWrapper, Value

from .. import clock, conf


def lease_seconds() -> float:
    return float(conf.get("LEASE_SECONDS"))


def valid_until(started: float) -> float:
    """The time.monotonic() until which a lease set by a statement sent at `started` surely holds.

    Counted from before the statement that set the lease, so it ends no later than the
    database's deadline; the margin covers clock-rate drift between the two machines.
    """
    lease = lease_seconds()
    return started + lease - min(2.0, lease * 0.05)


def lease_expiry():
    """The end of a lease set now, as an expression of the database's clock."""
    return ExpressionWrapper(
        clock.db_now() + Value(dt.timedelta(seconds=lease_seconds())), output_field=DateTimeField()
    )
