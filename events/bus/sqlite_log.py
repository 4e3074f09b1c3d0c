"""The embedded bus's SQLite layout and connection settings, shared by the bus and its consumers.

One module below both, so ``embedded`` (which makes consumers) and ``embedded_consumer``
(which reads the log) need not import each other.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

SCHEMA = """
CREATE TABLE IF NOT EXISTS topics(name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log(topic TEXT, part INTEGER, off INTEGER, key BLOB, headers TEXT,
    value BLOB, ts REAL, PRIMARY KEY(topic, part, off)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS offsets(grp TEXT, topic TEXT, part INTEGER, off INTEGER,
    PRIMARY KEY(grp, topic, part)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS members(grp TEXT, member TEXT, seen REAL, PRIMARY KEY(grp, member)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases(grp TEXT, topic TEXT, part INTEGER, member TEXT, expires REAL,
    PRIMARY KEY(grp, topic, part)) WITHOUT ROWID;
"""


def connect(path: str, *, synchronous: str = "FULL") -> sqlite3.Connection:
    """A connection in autocommit mode, WAL journal, waiting on locks instead of failing."""
    conn = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("PRAGMA busy_timeout=30000")
    return conn


def encode_headers(headers: Sequence[tuple[str, bytes]]) -> str:
    return json.dumps([[k, v.decode("latin-1")] for k, v in headers])


def decode_headers(text: str) -> tuple[tuple[str, bytes], ...]:
    return tuple((k, v.encode("latin-1")) for k, v in json.loads(text))
