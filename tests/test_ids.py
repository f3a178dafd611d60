"""Run ids (ids.py): each carries a time, derived ones the same at every attempt, and the
partition key that follows from an id alone. Pure logic: no database."""

from __future__ import annotations

import datetime as dt
import uuid

from django_durable import ids

SINCE = dt.datetime(2026, 11, 25, 12, tzinfo=dt.timezone.utc)


def at(moment: dt.datetime, version: int = 7) -> uuid.UUID:
    return ids._with_time(int((moment - ids.EPOCH).total_seconds() * 1000), version, 0xABCDEF)


def test_a_new_run_id_is_a_uuid7_carrying_the_time_it_was_made():
    before = dt.datetime.now(dt.timezone.utc)
    made = ids.uuid7()
    after = dt.datetime.now(dt.timezone.utc)
    assert (made.version, made.variant) == (7, uuid.RFC_4122)
    carried = ids.EPOCH + dt.timedelta(milliseconds=ids.millis(made))
    assert before - dt.timedelta(milliseconds=1) <= carried <= after
    assert ids.uuid7() != made


def test_a_child_id_is_the_same_at_every_replay_and_carries_its_parents_time():
    parent = ids.uuid7()
    child = ids.child_id(parent, "receipt")
    assert child == ids.child_id(parent, "receipt")
    assert (child.version, child.variant) == (8, uuid.RFC_4122)
    assert ids.millis(child) == ids.millis(parent)
    assert len({child, ids.child_id(parent, "receipt:2"), ids.child_id(ids.uuid7(), "receipt")}) == 3
    grandchild = ids.child_id(child, "label")
    assert ids.millis(grandchild) == ids.millis(parent)  # a family shares its eldest's time
    assert ids.millis(ids.child_id(uuid.uuid4(), "k")) == 0  # a parent without a time: 1970


def test_a_scheduled_run_id_is_one_per_fire_time_and_carries_it():
    fire = dt.datetime(2026, 12, 1, 3, 0, tzinfo=dt.timezone.utc)
    made = ids.scheduled_id("nightly", fire)
    assert made == ids.scheduled_id("nightly", fire.astimezone(dt.timezone(dt.timedelta(hours=1))))
    assert made != ids.scheduled_id("nightly", fire + dt.timedelta(days=1)) != ids.scheduled_id("weekly", fire)
    assert ids.EPOCH + dt.timedelta(milliseconds=ids.millis(made)) == fire


def test_the_partition_key_is_the_time_in_the_id_from_the_conversion_on():
    later = SINCE + dt.timedelta(hours=5, milliseconds=7)
    assert ids.id_time(at(later), None) == ids.EPOCH  # runs not partitioned
    assert ids.id_time(at(later), SINCE) == later
    assert ids.id_time(at(later, version=8), SINCE) == later
    assert ids.id_time(at(SINCE), SINCE) == SINCE
    assert ids.id_time(at(SINCE - dt.timedelta(milliseconds=1)), SINCE) == ids.EPOCH  # made before: the old table
    assert ids.id_time(uuid.uuid4(), SINCE) == ids.EPOCH  # no time in it
    assert ids.id_time(uuid.uuid5(uuid.NAMESPACE_URL, "x"), SINCE) == ids.EPOCH
    parent = at(later)
    assert ids.id_time(ids.child_id(parent, "k"), SINCE) == ids.id_time(parent, SINCE)


def test_only_a_parent_made_before_the_cutoff_looks_for_a_child_under_its_old_id():
    old = at(ids.LEGACY_CHILDREN_BEFORE - dt.timedelta(seconds=1))
    assert ids.legacy_child_of(old, "later") == uuid.uuid5(old, "later") == ids.legacy_child_id(old, "later")
    assert ids.legacy_child_of(at(ids.LEGACY_CHILDREN_BEFORE), "later") is None
    legacy_parent = uuid.uuid5(old, "a")  # a child of the old builds, itself a parent
    assert ids.legacy_child_of(legacy_parent, "b") == uuid.uuid5(legacy_parent, "b")


def test_claim_tokens_are_random_uuid4s_that_behave_as_uuid4s_do():
    """random_uuids() makes its UUIDs without UUID.__init__: each is still a version 4 UUID equal to,
    hashing as, printing and pickling as the UUID its text gives, and none repeats."""
    import pickle

    made = ids.random_uuids(500) + ids.random_uuids(1)
    assert len(set(made)) == len(made) == 501
    for token in made[:50] + made[-1:]:
        again = uuid.UUID(str(token))
        assert (token.version, token.variant, token.is_safe) == (4, uuid.RFC_4122, uuid.SafeUUID.unknown)
        assert token == again and hash(token) == hash(again) and repr(token) == repr(again)
        assert token.bytes == again.bytes and pickle.loads(pickle.dumps(token)) == token
    bits = [token.int for token in made]  # the other 122 bits random: each set in some, clear in some
    free = [bit for bit in range(128) if ~((0xF000 << 64) | (0xC000 << 48)) >> bit & 1]
    assert len(free) == 122
    assert all(0 < sum(n >> bit & 1 for n in bits) < len(bits) for bit in free)
