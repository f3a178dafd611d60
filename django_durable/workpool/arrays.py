"""The hot statements' array parameters (statements.Binary) in PostgreSQL's binary format, dumped
in one pass.

psycopg's own binary list dumper is general. A cursor makes a new Transformer whenever its
statement changes (a worker's kept cursor does at each statement), and for each array the
Transformer then makes that dumper (and a Transformer of its own inside it), which scans the list
twice for its items' types and makes a second dumper for the array and a third for its items;
then it calls the item dumper and packs a length for each item in Python. The ids, tokens and
results of every claim and every batched end went that way.

Here the first item that is not None chooses one of four item encoders (uuid, int as bigint,
str as text, an aware datetime as timestamptz), and the array is packed in one comprehension.
Any other list (empty, all None, of another type or nested) is dumped by psycopg's dumper, so
that what is sent is what psycopg would send, but for integers: always a bigint array, where
psycopg picks the smallest integer type that holds the largest. Every statement casts its
arrays to the columns' types, so the server converts either.
"""

from __future__ import annotations

import datetime as dt
import struct
import uuid
from typing import Any

from psycopg import abc, pq
from psycopg.abc import AdaptContext, Buffer, DumperKey
from psycopg.adapt import Dumper, PyFormat, Transformer
from psycopg.types.array import ListBinaryDumper

_head = struct.Struct("!iiIii").pack  # dimensions (1), has a null, item oid, length, lower bound (1)
_length = struct.Struct("!i").pack
_bigint = struct.Struct("!iq").pack  # an item's length (8) and its value
_NULL = b"\xff\xff\xff\xff"  # an item's length -1: NULL
_UUID = b"\x00\x00\x00\x10"  # an item's length 16

# Item oid: array oid, of the types psycopg's binary dumpers give str and an aware datetime.
_ARRAY_OF = {25: 1009, 1043: 1015, 1184: 1185}
_UUID_OID, _UUID_ARRAY_OID, _INT8_OID, _INT8_ARRAY_OID = 2950, 2951, 20, 1016


class ArrayDumper(Dumper):
    """Dumps a statements.Binary list: a list of uuids, ints, strs or aware datetimes (and None)
    packed here, any other by psycopg's ListBinaryDumper."""

    format = pq.Format.BINARY

    def __init__(self, cls: type, context: AdaptContext | None = None):
        super().__init__(cls, context)
        self.context = context
        self.general: ListBinaryDumper | None = None

    def get_key(self, obj: list[Any], format: PyFormat) -> DumperKey:
        first = _first(obj)
        if first is None:
            return self._general().get_key(obj, format)
        return self.cls, type(first), ArrayDumper  # (psycopg's keys for a list have at most two parts)

    def upgrade(self, obj: list[Any], format: PyFormat) -> Dumper:
        first = _first(obj)
        if type(first) is uuid.UUID:
            return _Uuids(self.cls, self.context)
        if type(first) is int:
            return _Bigints(self.cls, self.context)
        if first is not None:
            item_dumper = Transformer.from_context(self.context).get_dumper(first, PyFormat.BINARY)
            if item_dumper.oid in _ARRAY_OF:  # (else a dumper of another type was registered for it)
                return _Items(self.cls, self.context, item_dumper)
        return self._general().upgrade(obj, format)

    def dump(self, obj: list[Any]) -> Buffer | None:  # (abstract in Dumper; never called: get_key always upgrades)
        return self._general().upgrade(obj, PyFormat.BINARY).dump(obj)

    def _general(self) -> ListBinaryDumper:
        if self.general is None:
            self.general = ListBinaryDumper(self.cls, self.context)
        return self.general


def _first(obj: list[Any]) -> Any:
    """`obj`'s first item that is not None, if it is of a type packed here; else None."""
    for item in obj:
        if item is not None:
            kind = type(item)
            if kind is uuid.UUID or kind is int or kind is str or (kind is dt.datetime and item.tzinfo is not None):
                return item
            return None
    return None


def _packed(item_oid: int, items: list[bytes]) -> bytes:
    """A one-dimensional array of `items` (each with its length, or _NULL) of type `item_oid`."""
    return b"".join([_head(1, _NULL in items, item_oid, len(items), 1), *items])


class _Uuids(Dumper):
    format, oid = pq.Format.BINARY, _UUID_ARRAY_OID

    def dump(self, obj: list[Any]) -> Buffer | None:
        return _packed(_UUID_OID, [_NULL if item is None else _UUID + item.int.to_bytes(16, "big") for item in obj])


class _Bigints(Dumper):
    format, oid = pq.Format.BINARY, _INT8_ARRAY_OID

    def dump(self, obj: list[Any]) -> Buffer | None:
        return _packed(_INT8_OID, [_NULL if item is None else _bigint(8, item) for item in obj])


class _Items(Dumper):
    """Items dumped by psycopg's own binary dumper of their type (a str, an aware datetime)."""

    format = pq.Format.BINARY

    def __init__(self, cls: type, context: AdaptContext | None, item_dumper: abc.Dumper):
        super().__init__(cls, context)
        self.item_oid, self.oid = item_dumper.oid, _ARRAY_OF[item_dumper.oid]
        self.dump_item = item_dumper.dump

    def dump(self, obj: list[Any]) -> Buffer | None:
        dump: Any = self.dump_item  # (a str or a datetime: never None)
        return _packed(self.item_oid, [_NULL if item is None else _length(len(data := dump(item))) + data
                                       for item in obj])
