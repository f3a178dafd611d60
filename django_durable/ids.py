"""Run ids: each carries a time in its first 48 bits, which is the run's partition where runs are partitioned.

- A run started by code gets a UUIDv7 (RFC 9562): the time it was made, then random bits.
- A run whose id must be the same at every attempt (a child started by a replayed parent, a
  schedule's fire time) gets a UUIDv8 made from what it is derived from: a child carries its
  parent's time and a hash of (parent, key); a scheduled run its fire time and a hash of
  (schedule, fire time). A child thus sits in its parent's partition.

Ids made before 2026-11-25 derived children and scheduled runs as UUIDv5 (no time in them);
``legacy_child_id`` still names those, so a parent that started one under the old code finds it.

``id_time`` is the partition key of a run (``WorkflowRun.id_time``): the time in its id, or 1970
for an id without one and for every run made before the runs table was partitioned. A function of
the id alone, so one id always falls in one partition, and the primary key (id, id_time) keeps
ids unique across all partitions; PostgreSQL's twin of it is ``durable_run_id_time(uuid)``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import time
import uuid

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MS_MASK = 2**48 - 1
# Scheduled runs' ids, before and now: the namespace of their hash.
SCHEDULE_NAMESPACE = uuid.UUID("5f0c5a3e-1c7b-4d1e-9a57-6d7572616265")


def uuid7() -> uuid.UUID:
    """Return a time-ordered UUID (RFC 9562 version 7); new rows land at the end of the index."""
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    return _with_time(millis, 7, rand)


# A version 4 UUID's fixed bits: its version (4) and its variant (RFC 9562's, 0b10).
_V4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_V4_SET = (4 << 76) | (0x8000 << 48)
_new, _set, _UNKNOWN, _UUID = object.__new__, object.__setattr__, uuid.SafeUUID.unknown, uuid.UUID


def random_uuids(k: int) -> list[uuid.UUID]:
    """`k` random UUIDs (version 4), as `k` calls of uuid.uuid4() make them: a worker's claim
    tokens. Made from one read of os.urandom, and each as UUID.__init__ leaves one (its two
    attributes set) without that method's checks of arguments that cannot be wrong here: a
    third of uuid4()'s cost, a claim token for every job a worker runs."""
    data = os.urandom(16 * k)
    made = []
    for start in range(0, 16 * k, 16):
        token = _new(_UUID)
        _set(token, "int", (int.from_bytes(data[start:start + 16], "big") & _V4_CLEAR) | _V4_SET)
        _set(token, "is_safe", _UNKNOWN)
        made.append(token)
    return made


def _with_time(millis: int, version: int, bits: int) -> uuid.UUID:
    """A UUID of `version` whose first 48 bits are `millis` and the other 74 free ones from `bits`."""
    value = (millis & _MS_MASK) << 80
    value |= version << 76
    value |= ((bits >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= bits & (2**62 - 1)
    return uuid.UUID(int=value)


def _derived(millis: int, *parts: bytes) -> uuid.UUID:
    digest = hashlib.blake2b(b"\0".join(parts), digest_size=10).digest()
    return _with_time(millis, 8, int.from_bytes(digest, "big"))


def millis(run_id: uuid.UUID) -> int | None:
    """The milliseconds since 1970 an id carries (version 7 or 8), or None for one without a time."""
    if run_id.version not in (7, 8):
        return None
    return run_id.int >> 80


def child_id(parent_id: uuid.UUID, key: str) -> uuid.UUID:
    """The id of the child a run starts under `key`: the same at every replay, in the parent's partition."""
    return _derived(millis(parent_id) or 0, parent_id.bytes, key.encode())


def legacy_child_id(parent_id: uuid.UUID, key: str) -> uuid.UUID:
    """The id the same child had when it was started before 2026-11-25 (UUIDv5, no time in it)."""
    return uuid.uuid5(parent_id, key)


# Builds before this one (none of them released) derived children's ids as UUIDv5. A parent made
# before this moment may have started a child so and crashed before it recorded that; its replay
# looks for that child first. A parent made after it never has one, and pays no lookup.
LEGACY_CHILDREN_BEFORE = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)


def legacy_child_of(parent_id: uuid.UUID, key: str) -> uuid.UUID | None:
    """The UUIDv5 id a child of `parent_id` under `key` may have (legacy_child_id), or None for a
    parent made too recently to have started one so."""
    moment = millis(parent_id)
    if moment is not None and EPOCH + dt.timedelta(milliseconds=moment) >= LEGACY_CHILDREN_BEFORE:
        return None
    return legacy_child_id(parent_id, key)


def scheduled_id(slug: str, fire_time: dt.datetime) -> uuid.UUID:
    """The id of a schedule's run for `fire_time`: one per fire time, in the fire time's partition."""
    fire_time = fire_time.astimezone(dt.timezone.utc)
    moment = int((fire_time - EPOCH) / dt.timedelta(milliseconds=1))
    return _derived(moment, SCHEDULE_NAMESPACE.bytes, f"{slug}@{fire_time.isoformat()}".encode())


def id_time(run_id: uuid.UUID, since: dt.datetime | None) -> dt.datetime:
    """A run's partition key: the time its id carries, if runs were partitioned `since` before it;
    else 1970 (the partition of the runs from before, or a plain table: `since` None)."""
    if since is None:
        return EPOCH
    moment = millis(run_id)
    if moment is None:
        return EPOCH
    at = EPOCH + dt.timedelta(milliseconds=moment)
    return at if at >= since else EPOCH


# The same in SQL, made by the conversion with its `since` (partitioning/runs.py): IMMUTABLE, so that
# a statement's `id_time = durable_run_id_time($1)` names one partition before it runs, and one
# immutable expression without FROM, so that the planner inlines it (`timestamptz + interval` is
# only STABLE, which would keep it a function call: measured, twice the cost of a lookup by id).
ID_TIME_FUNCTION = """
CREATE OR REPLACE FUNCTION durable_run_id_time(run_id uuid) RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN substr(run_id::text, 15, 1) IN ('7', '8') AND {moment} >= {{since_ms}}
                THEN to_timestamp({moment} / 1000.0)
                ELSE to_timestamp(0) END
$$""".format(moment="('x' || lpad(replace(substr(run_id::text, 1, 13), '-', ''), 16, '0'))::bit(64)::bigint")


def run_pk(run_id) -> uuid.UUID:
    """The UUID of a run id a caller gave (a UUID or its text); raise WorkflowNotFound for anything else."""
    from .exceptions import WorkflowNotFound

    try:
        return run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
    except ValueError:
        raise WorkflowNotFound(f"No workflow run has the id {str(run_id)[:80]!r}.") from None


def check_name(name, what: str) -> None:
    """Refuse a name of a signal, event, update or stream (`what`) that is not 1 to 200 characters: ValueError."""
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        raise ValueError(f"A {what} name must be a string of 1 to 200 characters, not {str(name)[:80]!r}.")
