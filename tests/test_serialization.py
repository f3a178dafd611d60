"""JSON encoding of payloads: the extra types round-trip, everything else is refused by name."""

import datetime as dt
import uuid
from decimal import Decimal

import pytest

from django_durable import serialization
from django_durable.exceptions import NotSerializable, PayloadTooLarge

UTC = dt.timezone.utc


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        0,
        -(2**70),
        1.5,
        "text with ünïcode and \"quotes\"",
        [1, [2, [3]]],
        {"a": 1, "b": {"c": [None, False]}},
        dt.datetime(2026, 11, 22, 5, 31, 2, 123456, tzinfo=UTC),
        dt.datetime(2026, 11, 22, 5, 31, 2, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
        dt.datetime(2026, 11, 22, 5, 31),
        dt.date(2026, 2, 28),
        dt.time(23, 59, 59, 999999),
        dt.timedelta(days=-1, seconds=5, microseconds=7),
        Decimal("12345678901234567890.000000001"),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        {"when": [dt.date(2020, 1, 1), {"amount": Decimal("1.10")}]},
    ],
)
def test_values_round_trip(value):
    decoded = serialization.decode(serialization.encode(value))
    assert decoded == value
    assert type(decoded) is type(value)


def test_timezone_survives_round_trip():
    value = dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert serialization.decode(serialization.encode(value)).utcoffset() == dt.timedelta(hours=2)


def test_dict_key_order_is_kept():
    value = {"zebra": 1, "apple": 2, "mango": 3}
    assert list(serialization.decode(serialization.encode(value))) == ["zebra", "apple", "mango"]


def test_a_user_dict_that_looks_like_a_tagged_value_round_trips():
    value = {"__durable__": "date", "v": "2020-01-01"}
    assert serialization.decode(serialization.encode(value)) == value
    nested = {"outer": {"__durable__": "uuid", "v": "x", "extra": dt.date(2020, 1, 2)}}
    assert serialization.decode(serialization.encode(nested)) == nested


def test_tuples_become_lists():
    assert serialization.decode(serialization.encode((1, (2, 3)))) == [1, [2, 3]]


def test_str_and_int_subclasses_are_stored_as_plain_values():
    from enum import IntEnum

    from django.db.models import TextChoices

    class Colour(TextChoices):
        RED = "red"

    class Level(IntEnum):
        HIGH = 3

    assert serialization.decode(serialization.encode([Colour.RED, Level.HIGH])) == ["red", 3]


class Custom:
    pass


@pytest.mark.parametrize(
    "value, type_name, where",
    [
        ({"tags": {1, 2}}, "builtins.set", "value['tags']"),
        ([b"raw"], "builtins.bytes", "value[0]"),
        ({"a": [1, Custom()]}, "Custom", "value['a'][1]"),
        ((x for x in range(3)), "builtins.generator", "value"),
        ({"f": lambda: 1}, "builtins.function", "value['f']"),
    ],
)
def test_unsupported_types_are_refused_with_their_type_and_place(value, type_name, where):
    with pytest.raises(NotSerializable) as info:
        serialization.encode(value)
    message = str(info.value)
    assert type_name in message
    assert message.startswith(where)


def test_model_instances_are_refused():
    from django.contrib.auth.models import User

    with pytest.raises(NotSerializable, match="django.contrib.auth.models.User"):
        serialization.encode({"user": User(username="x")}, what="input")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), Decimal("NaN"), Decimal("-Infinity")])
def test_non_finite_numbers_are_refused(value):
    with pytest.raises(NotSerializable):
        serialization.encode({"x": value})


def test_non_string_keys_are_refused():
    with pytest.raises(NotSerializable, match="key 1 of type int"):
        serialization.encode({1: "a"})


def test_deep_nesting_is_refused_without_recursion_error():
    value = []
    for _ in range(100_000):
        value = [value]
    with pytest.raises(NotSerializable, match="nested more than"):
        serialization.encode(value)


def test_payload_limit():
    serialization.encode("x" * 1000, max_bytes=2000)
    with pytest.raises(PayloadTooLarge, match="more than the limit of 2000 bytes"):
        serialization.encode("é" * 1500, max_bytes=2000)


def test_nothing_in_the_package_imports_pickle():
    from pathlib import Path

    import django_durable

    package = Path(django_durable.__file__).parent
    offenders = [
        str(path)
        for path in package.rglob("*.py")
        if "import pickle" in path.read_text() or "from pickle" in path.read_text()
    ]
    assert offenders == []


def test_a_lone_surrogate_is_stored_escaped_and_reads_back():
    """Valid JSON, not UTF-8: the text must still be storable (PostgreSQL) and sendable."""
    value = {"k": "a\udc80 é"}
    stored = serialization.encode(value)
    stored.encode()  # no UnicodeEncodeError
    assert serialization.decode(stored) == value
    assert serialization.encode({"k": "é"}) == '{"k":"é"}'  # other text keeps its characters
    error = serialization.dumps_error(ValueError("bad \udc80"))
    error.encode()
    assert serialization.error_parts(error) == {"type": "ValueError", "message": "bad \udc80"}
    serialization.dumps({"k": "\udc80"}, indent=2).encode()


def test_error_parts_never_gives_the_traceback():
    error = serialization.dumps_error(KeyError("order"), "Traceback ... secret")
    assert serialization.error_parts(error) == {"type": "KeyError", "message": "'order'"}
    assert serialization.error_parts("not json", limit=3) == {"type": "", "message": "not"}
    assert serialization.error_parts(None) is None


@pytest.mark.django_db
def test_a_model_instance_as_an_argument_is_refused_with_its_pk_and_subject_suggested():
    import django_durable as durable
    from tests.testapp.models import Ticket

    ticket = Ticket.objects.create(title="printer")
    with pytest.raises(durable.NotSerializable, match=rf"ticket_id={ticket.pk!r}.*subject=ticket"):
        durable.start("tests.echo", ticket)
