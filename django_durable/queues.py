"""Queues with limits (DURABLE_QUEUES): how many items of a queue run at once, how many of one
concurrency key, and how many start per period, across every worker; and queues whose concurrency
keys take turns ("fairness", workpool/fairness.py: it orders a queue, it holds nothing back).

    DURABLE_QUEUES = {
        "emails": {"concurrency": 5, "rate_limit": "10/s"},
        "reports": {"concurrency": 20, "key_concurrency": 1, "fairness": True},
    }

A queue not named here has no limits. The limits are enforced in the claim itself, so two
workers never both take the last slot: on PostgreSQL the claims of a limited queue take turns on
a transaction-scoped advisory lock and then count what runs (see workpool/postgres.py); on SQLite
the claim's IMMEDIATE transaction already makes writers take turns.

What runs is what is claimed: a work item counts against its queue's concurrency from its claim to
its end (a crashed worker's item counts until its lease runs out and the reaper takes it back). A
workflow run counts while one of its items is being processed, not while it sleeps or waits.
A rate limit spaces the claims of the queue evenly: "10/s" is one claim every 100 ms at most, so
any window of T seconds holds at most 10·T + 1 claims (a task's execution, or a workflow's advance).

Queues are also steered at runtime (services/queue_control.py): paused, or given limits that
override the setting until cleared, in the table QueueControl. A pause is read by the claim
statement itself (WorkItemQuerySet.ready() leaves out the paused queues' items), so every worker's
next claim honours it; the limits are the setting's with the overrides on top, as a worker last
read them (refresh(), at most once a second, before a claim).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from dataclasses import dataclass

from . import conf

_UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([a-z]+?)s?\s*$")
KNOWN = ("concurrency", "key_concurrency", "rate_limit", "fairness")


@dataclass(frozen=True)
class QueueLimits:
    """One queue's limits (None: no such limit)."""

    name: str
    concurrency: int | None = None
    key_concurrency: int | None = None
    rate: tuple[int, float] | None = None  # (claims, per seconds)
    fair: bool = False  # the concurrency keys take turns (fairness.py)
    weights: tuple[tuple[str, int], ...] = ()  # (key, weight) of the keys whose weight is not 1

    def weight(self, key: str) -> int:
        """How many items of `key` a fair queue takes in one turn of the keys (1 unless weighted)."""
        for name, weight in self.weights:
            if name == key:
                return weight
        return 1

    @property
    def interval(self) -> float | None:
        """Seconds between two claims of the queue at most its rate (None: no rate limit)."""
        return None if self.rate is None else self.rate[1] / self.rate[0]

    def describe(self) -> str:
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} at once")
        if self.key_concurrency is not None:
            parts.append(f"{self.key_concurrency} per key")
        if self.rate is not None:
            count, seconds = self.rate
            parts.append(f"{count} per {seconds:g} s")
        if self.fair:
            parts.append("fair shares by key" + (" (weighted)" if self.weights else ""))
        return ", ".join(parts) or "no limits"


def parse_rate(text) -> tuple[int, float]:
    """"10/s", "100/min", "5/10s", "1000/hour" -> (claims, seconds); ValueError for anything else."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None or match.group(3) not in _UNITS:
        raise ValueError(f"A rate limit is written as 'N/unit' or 'N/Kunit' (s, min, hour, day), such as "
                         f"'10/s' or '100/min', not {text!r}.")
    count, multiple, unit = int(match.group(1)), float(match.group(2) or 1), _UNITS[match.group(3)]
    if count <= 0 or multiple <= 0:
        raise ValueError(f"A rate limit must allow a positive number of claims per period, not {text!r}.")
    return count, multiple * unit


def _positive(queue: str, name: str, value) -> int:
    if type(value) is not int or value <= 0:
        raise ValueError(f"DURABLE_QUEUES[{queue!r}][{name!r}] must be a positive integer, not {value!r}.")
    return value


def parse(setting) -> dict[str, QueueLimits]:
    """DURABLE_QUEUES, checked: {queue name: QueueLimits}; ValueError naming what is wrong."""
    if not isinstance(setting, dict):
        raise ValueError(f"DURABLE_QUEUES must be a dict of queue names to their limits, not {type(setting).__name__}.")
    limits = {}
    for name, options in setting.items():
        if not isinstance(name, str) or not 0 < len(name) <= 100:
            raise ValueError(f"A queue name in DURABLE_QUEUES must be a string of 1 to 100 characters, not {name!r}.")
        if not isinstance(options, dict):
            raise ValueError(f"DURABLE_QUEUES[{name!r}] must be a dict such as {{'concurrency': 5}}, not {options!r}.")
        unknown = sorted(set(options) - set(KNOWN))
        if unknown:
            raise ValueError(f"DURABLE_QUEUES[{name!r}] has {unknown[0]!r}, which is not a setting of a queue; "
                             f"use {', '.join(KNOWN)}.")
        rate = options.get("rate_limit")
        try:
            rate = None if rate is None else parse_rate(rate)
        except ValueError as exc:
            raise ValueError(f"DURABLE_QUEUES[{name!r}]['rate_limit']: {exc}") from None
        fair, weights = _fairness(name, options.get("fairness", False))
        limits[name] = QueueLimits(
            name,
            concurrency=None if options.get("concurrency") is None else _positive(name, "concurrency", options["concurrency"]),
            key_concurrency=None if options.get("key_concurrency") is None
            else _positive(name, "key_concurrency", options["key_concurrency"]),
            rate=rate, fair=fair, weights=weights,
        )
    return limits


def _fairness(queue: str, value) -> tuple[bool, tuple[tuple[str, int], ...]]:
    """A queue's "fairness": False, True, or {"weights": {key: positive integer}}."""
    if isinstance(value, bool):
        return value, ()
    what = f"DURABLE_QUEUES[{queue!r}]['fairness']"
    if not isinstance(value, dict) or set(value) - {"weights"}:
        raise ValueError(f"{what} must be True, False or {{'weights': {{key: weight}}}}, not {value!r}.")
    weights = value.get("weights", {})
    if not isinstance(weights, dict):
        raise ValueError(f"{what}['weights'] must be a dict of concurrency keys to weights, not {weights!r}.")
    for key, weight in weights.items():
        if not isinstance(key, str) or len(key) > 200:
            raise ValueError(f"{what}['weights'] has {key!r}, which is not a concurrency key (a string).")
        if type(weight) is not int or not 0 < weight <= 1000:
            raise ValueError(f"{what}['weights'][{key!r}] must be an integer from 1 to 1000, not {weight!r}.")
    return True, tuple(sorted((key, weight) for key, weight in weights.items() if weight != 1))


# The limits set at runtime (QueueControl) as this process last read them (refresh()): (name,
# concurrency, key_concurrency, rate_limit) of each queue that has one, sorted by name.
_controls: tuple = ()
_read_at = -math.inf  # time.monotonic() of the last read
REFRESH_SECONDS = 1.0
CONTROLS_SQL = ("SELECT name, concurrency, key_concurrency, rate_limit FROM durable_queue_control "
                "WHERE concurrency IS NOT NULL OR key_concurrency IS NOT NULL OR rate_limit <> '' ORDER BY name")


def refresh(db: str, *, force: bool = False, rows=None) -> None:
    """Read the limits set at runtime (QueueControl) again, if the last read is a second old (or
    `force`): a worker does before a claim, so a change made on one host is in force on every
    worker within a second. (A pause needs none of this: the claim statement reads it.) `rows`:
    QueueControl's (name, concurrency, key_concurrency, rate_limit), read by the caller already."""
    global _controls, _read_at
    now = time.monotonic()
    if rows is None and not force and now - _read_at < REFRESH_SECONDS:
        return
    if rows is None:
        from django.db import connections

        with connections[db].cursor() as cursor:
            cursor.execute(CONTROLS_SQL)
            rows = cursor.fetchall()
    rows = tuple(sorted(tuple(row) for row in rows if row[1] is not None or row[2] is not None or row[3]))
    _read_at = now
    if rows != _controls:
        _controls = rows


def _overridden(queues: dict[str, QueueLimits]) -> dict[str, QueueLimits]:
    """The setting's queues with the runtime overrides (QueueControl) on top."""
    merged = dict(queues)
    for name, concurrency, key_concurrency, rate_limit in _controls:
        limits = merged.get(name) or QueueLimits(name)
        changes = {}
        if concurrency is not None:
            changes["concurrency"] = concurrency
        if key_concurrency is not None:
            changes["key_concurrency"] = key_concurrency
        if rate_limit:
            try:
                changes["rate"] = parse_rate(rate_limit)
            except ValueError:  # (checked when set: a row edited by hand keeps the setting's rate)
                pass
        merged[name] = dataclasses.replace(limits, **changes)
    return merged


_parsed: tuple = (None, (), {}, {}, {})


def _setting() -> tuple:
    """(the setting, the overrides, its queues with a limit, its fair queues, both), made once for
    each value of the setting and of the overrides."""
    global _parsed
    setting = conf.get("QUEUES")
    if _parsed[0] is not setting or _parsed[1] is not _controls:
        queues = _overridden(parse(setting) if setting else {})
        limited = {name: limits for name, limits in queues.items()
                   if (limits.concurrency, limits.key_concurrency, limits.rate) != (None, None, None)}
        fair = {name: limits for name, limits in queues.items() if limits.fair}
        _parsed = (setting, _controls, limited, fair,
                   {name: queues[name] for name in sorted(limited.keys() | fair.keys())})
    return _parsed


def configured() -> dict[str, QueueLimits]:
    """The queues with a limit or fairness, by name: what the overview and `durable stats` show."""
    return _setting()[4]


def limited() -> dict[str, QueueLimits]:
    """The queues that have a limit, by name. (Fairness is not a limit: it orders, it holds nothing back.)"""
    return _setting()[2]


def fair(queue: str) -> QueueLimits | None:
    """The settings of `queue` if its concurrency keys take turns ("fairness"), else None."""
    return _setting()[3].get(queue)


def served(queues: list[str] | None) -> list[QueueLimits]:
    """The limited queues among `queues` (None: every queue), by name: the order their locks are taken in."""
    return [limits for name, limits in sorted(limited().items()) if queues is None or name in queues]
