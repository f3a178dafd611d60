"""Large payloads kept out of the durable tables: in a Django storage, read back when needed.

With DURABLE_PAYLOAD_OFFLOAD_BYTES set, an input, a step's or a run's result, or a signal payload
whose JSON is larger than that is written to ``STORAGES["durable"]`` (a folder, S3 through
django-storages, ...) and its column holds a small reference instead:
``{"__durable__": "stored", "v": {"name": "<run id>/<uuid>.json", "bytes": 104857600}}``. The rows
the claim path and the admin read stay small whatever the payloads are.

Writing streams the JSON to a temporary file as it is encoded, so the value is in memory once (not
once more as text); a reference is recorded in ``durable_stored_payload`` first, so the prune finds
and deletes the files of the runs it deletes. Reading is lazy: the file is opened when the value is
decoded, which the engine does when the workflow code asks for it (a replay passing a step returns
its recorded result then). The admin and the API show the reference, with a link where the storage
gives URLs, never the body.
"""

from __future__ import annotations

import json
import logging
import tempfile
import uuid
from typing import Any

from . import conf  # and the store's rows (models.stored): serialization imports this module

logger = logging.getLogger("django_durable")

TAG = "stored"
PREFIX = '{"__durable__":"stored"'  # how a reference's text begins
STORAGE_ALIAS = "durable"
CHUNK = 1 << 16


def threshold() -> int | None:
    """The size above which payloads are stored apart, or None when they never are."""
    limit = conf.get("PAYLOAD_OFFLOAD_BYTES")
    return None if limit is None else int(limit)


def storage():
    from django.core.files.storage import storages

    return storages[STORAGE_ALIAS]


# json's C encoder, one value at a time, ASCII (characters are bytes).
_ENCODE = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), check_circular=False).encode
# How deep containers are taken apart: below, each value is encoded whole by the C encoder.
PIECE_DEPTH = 2


def _pieces(obj: Any, depth: int = 0):
    """The JSON text of `obj` in pieces: its containers taken apart down to PIECE_DEPTH, each value
    below that encoded whole (fast), so no piece is much bigger than one item of a big list."""
    kind = type(obj)
    if depth < PIECE_DEPTH and kind is list and obj:
        yield "["
        for index, item in enumerate(obj):
            if index:
                yield ","
            yield from _pieces(item, depth + 1)
        yield "]"
    elif depth < PIECE_DEPTH and kind is dict and obj:
        yield "{"
        for index, (key, item) in enumerate(obj.items()):
            yield f"{',' if index else ''}{_ENCODE(key)}:"
            yield from _pieces(item, depth + 1)
        yield "}"
    else:
        yield _ENCODE(obj)


def _surely_within(obj: Any, budget: int) -> bool:
    """Whether the JSON of `obj` is surely at most `budget` bytes: a bound counted from its
    strings (six bytes a character, the most an escape takes) and items, given up once over."""
    stack = [obj]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str:
            budget -= 6 * len(item) + 2
        elif kind is list:
            budget -= len(item) + 2
            stack.extend(item)
        elif kind is dict:
            budget -= 2 * len(item) + 2
            stack.extend(item)
            stack.extend(item.values())
        else:
            budget -= 32  # a number, true, false or null
        if budget < 0:
            return False
    return True


def encode_plain(plain: Any, owner, limit: int, dumps) -> str:
    """JSON text of `plain` (plain JSON values): itself when it is at most `limit` bytes, else a
    reference to the file it was streamed to. `dumps` encodes the small case as the caller would."""
    if _surely_within(plain, limit):
        return dumps(plain)  # the common case: no streaming, json's C encoder in one go
    chunks = _pieces(plain)
    head, size = [], 0
    for chunk in chunks:
        head.append(chunk)
        size += len(chunk)  # ASCII: characters are bytes
        if size > limit:
            break
    else:
        return dumps(plain)  # small after all: inline, as without offloading
    with tempfile.TemporaryFile() as spool:
        for chunk in head:
            spool.write(chunk.encode("ascii"))
        del head
        buffered = []
        for chunk in chunks:
            buffered.append(chunk)
            size += len(chunk)
            if len(buffered) >= 256:
                spool.write("".join(buffered).encode("ascii"))
                buffered.clear()
        spool.write("".join(buffered).encode("ascii"))
        spool.seek(0)
        return _store(spool, size, owner)


def _store(spool, size: int, owner) -> str:
    from django.core.files import File

    from .models.stored import StoredPayload  # the store's own rows, below serialization

    name = f"{owner}/{uuid.uuid4().hex}.json"
    # The reference first: a file without one could never be found by the prune again.
    StoredPayload.objects.create(run_id=owner, name=name, bytes=size)
    saved = storage().save(name, File(spool, name=name))
    if saved != name:
        StoredPayload.objects.filter(run_id=owner, name=name).update(name=saved)
    return json.dumps({"__durable__": TAG, "v": {"name": saved, "bytes": size}}, separators=(",", ":"))


def reference(text: str | None) -> dict | None:
    """The reference `text` holds ({"name", "bytes"}), or None if it holds a value."""
    if not text or not text.startswith(PREFIX):
        return None
    return json.loads(text)["v"]


def load(reference: dict, object_hook) -> Any:
    """The value stored at `reference` (the tag's "v")."""
    with storage().open(reference["name"], "rb") as stored:
        return json.load(stored, object_hook=object_hook)


def shown(reference: dict) -> dict:
    """What people and clients see of a stored payload: its size and, where the storage gives
    URLs, a link; never the body."""
    url = None
    try:
        url = storage().url(reference["name"])
    except NotImplementedError:
        pass
    return {"stored": {"bytes": reference["bytes"], "name": reference["name"], "url": url}}


def stored_of(run_ids) -> list[tuple]:
    """(run id, name) of each stored payload of these runs."""
    from .models.stored import StoredPayload  # the store's own rows, below serialization

    return list(StoredPayload.objects.filter(run_id__in=run_ids).values_list("run_id", "name"))


def delete(names) -> int:
    """Delete these stored payloads (of deleted runs): their references, then their files; return
    how many files went. A file that cannot be deleted is logged and left."""
    from .models.stored import StoredPayload  # the store's own rows, below serialization

    if not names:
        return 0
    StoredPayload.objects.filter(name__in=names).delete()
    return delete_files(names)


def delete_files(names) -> int:
    """Delete the files of these stored payloads, whose references are gone; return how many went.
    A file that cannot be deleted is logged and left. With none, nothing is asked of the storage
    (a project that stores nothing apart has none)."""
    if not names:
        return 0
    where, gone = storage(), 0
    for name in names:
        try:
            where.delete(name)
            gone += 1
        except Exception as exc:  # noqa: BLE001 - a file left behind must not stop the prune
            logger.warning("Could not delete the stored payload %s: %s", name, exc)
    return gone
