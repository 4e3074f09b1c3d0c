"""The StateStore protocol: key/value with TTL, compare-and-set, and indexed records.

Every plane keeps its small, shared state here: idempotency claims (dispatcher), job and
model records (functions), API token hashes (gateway). Two implementations ship and pass
``tests/contract/test_store_contract.py``: Redis (``cascade.stores.redis``) and SQLite
(``cascade.stores.sqlite``, the embedded default); ``cascade.stores.open_store`` picks one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson


@dataclass(frozen=True)
class RecordWrite:
    """One record for ``commit_records``: what ``put_record`` would store."""

    kind: str
    id: str
    doc: Mapping[str, Any]
    index: Sequence[str] = ()


class StateStore(Protocol):
    """Small shared state with atomic updates; values are bytes, records are JSON objects."""

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        """Set ``key``; with ``ttl`` (seconds) it disappears after that long."""
        ...

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if it existed."""
        ...

    def cas(self, key: str, expected: bytes | None, new: bytes | None, *, ttl: float | None = None) -> bool:
        """Atomically replace ``expected`` (None: key absent) with ``new`` (None: delete)."""
        ...

    def ttl(self, key: str) -> float | None:
        """Seconds until ``key`` expires; None if it has no TTL or does not exist."""
        ...

    def add_many(self, keys: Sequence[str], value: bytes, *, ttl: float | None = None) -> list[bytes | None]:
        """Set every key of ``keys`` that is absent to ``value``, in one round trip; per key, None where this call
        set it, else the value it already had. Each key is set atomically (not all of them as one)."""
        ...

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        """Set several keys in one round trip (each with ``ttl``)."""
        ...

    def put_record(self, kind: str, id: str, doc: Mapping[str, Any], *, index: Sequence[str] = ()) -> None:
        """Store a JSON record; fields named in ``index`` become queryable with find_records."""
        ...

    def get_record(self, kind: str, id: str) -> dict[str, Any] | None: ...

    def find_records(self, kind: str, **where: str) -> list[dict[str, Any]]:
        """Records of ``kind`` whose indexed fields equal ``where``, ordered by id."""
        ...

    def delete_record(self, kind: str, id: str) -> bool: ...

    def commit_records(self, guard: str, expected: bytes | None, new: bytes, puts: Sequence[RecordWrite],
                       deletes: Sequence[tuple[str, str]] = ()) -> bool:
        """One atomic, conditional write: if key ``guard`` holds ``expected`` (None: absent), set it to ``new``,
        store every record of ``puts`` and delete every ``(kind, id)`` of ``deletes``; else change nothing and
        return False. For state that one decision changes in many records (optimistic concurrency)."""
        ...

    def ping(self) -> None:
        """Raise StoreUnavailable unless the store answers."""
        ...

    def close(self) -> None: ...


def index_values(doc: Mapping[str, Any], index: Sequence[str]) -> dict[str, str]:
    """The indexed field values of a record (absent or null fields are not indexed)."""
    return {f: str(doc[f]) for f in index if doc.get(f) is not None}


def dump_doc(doc: Mapping[str, Any]) -> str:
    """A record as compact JSON, with orjson (an order of magnitude faster than the standard library, which the
    scheduler's journal felt); what orjson refuses (integers beyond 64 bits) goes through the standard library.
    NaN and infinities become null: JSON has no such numbers."""
    try:
        return orjson.dumps(doc, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(dict(doc), separators=(",", ":"))


def load_doc(raw: str | bytes) -> dict[str, Any]:
    """A record back from its JSON (the standard library reads what older releases wrote, NaN included)."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        doc = json.loads(raw)
    return doc if isinstance(doc, dict) else {}
