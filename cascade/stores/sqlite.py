"""The SQLite state store: the embedded default, safe for several processes on one machine.

Writes run in ``BEGIN IMMEDIATE`` transactions (WAL mode), so compare-and-set is atomic
across threads and processes. Expired keys are invisible at once and purged lazily.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cascade.core.errors import StoreUnavailable
from cascade.stores.base import RecordWrite, dump_doc, index_values, load_doc

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv(key TEXT PRIMARY KEY, value BLOB NOT NULL, expires REAL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS records(kind TEXT, id TEXT, doc TEXT NOT NULL, PRIMARY KEY(kind, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS record_index(kind TEXT, field TEXT, value TEXT, id TEXT,
    PRIMARY KEY(kind, field, value, id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS record_index_by_id ON record_index(kind, id);
"""
_LIVE = "(expires IS NULL OR expires > ?)"


class SqliteStore:
    """A StateStore in one SQLite file."""

    def __init__(self, path: str | Path, *, purge_every: int = 1000) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._writes = 0
        self._purge_every = purge_every

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from exc
            try:
                yield self._conn
                self._writes += 1
                if self._writes % self._purge_every == 0:
                    self._conn.execute("DELETE FROM kv WHERE expires <= ?", (time.time(),))
                self._conn.execute("COMMIT")
            except BaseException as exc:
                try:
                    self._conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite rolled back already (a full disk does)
                if isinstance(exc, sqlite3.Error):  # a full disk, a read-only file, an I/O error
                    raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from exc
                raise

    def _read(self, sql: str, args: Sequence[Any]) -> list[Any]:
        with self._lock:
            try:
                return self._conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from exc

    @staticmethod
    def _expires(ttl: float | None) -> float | None:
        return None if ttl is None else time.time() + ttl

    def get(self, key: str) -> bytes | None:
        rows = self._read(f"SELECT value FROM kv WHERE key=? AND {_LIVE}", (key, time.time()))
        return bytes(rows[0][0]) if rows else None

    def put(self, key: str, value: bytes, *, ttl: float | None = None) -> None:
        with self._tx() as c:
            c.execute("INSERT OR REPLACE INTO kv VALUES(?,?,?)", (key, value, self._expires(ttl)))

    def delete(self, key: str) -> bool:
        with self._tx() as c:
            return c.execute(f"DELETE FROM kv WHERE key=? AND {_LIVE}", (key, time.time())).rowcount > 0

    def cas(self, key: str, expected: bytes | None, new: bytes | None, *, ttl: float | None = None) -> bool:
        with self._tx() as c:
            row = c.execute(f"SELECT value FROM kv WHERE key=? AND {_LIVE}", (key, time.time())).fetchone()
            current = None if row is None else bytes(row[0])
            if current != expected:
                return False
            if new is None:
                c.execute("DELETE FROM kv WHERE key=?", (key,))
            else:
                c.execute("INSERT OR REPLACE INTO kv VALUES(?,?,?)", (key, new, self._expires(ttl)))
            return True

    def add_many(self, keys: Sequence[str], value: bytes, *, ttl: float | None = None) -> list[bytes | None]:
        out: list[bytes | None] = []
        with self._tx() as c:
            now, expires = time.time(), self._expires(ttl)
            for key in keys:
                row = c.execute(f"SELECT value FROM kv WHERE key=? AND {_LIVE}", (key, now)).fetchone()
                if row is None:
                    c.execute("INSERT OR REPLACE INTO kv VALUES(?,?,?)", (key, value, expires))
                out.append(None if row is None else bytes(row[0]))
        return out

    def put_many(self, items: Mapping[str, bytes], *, ttl: float | None = None) -> None:
        with self._tx() as c:
            expires = self._expires(ttl)
            c.executemany("INSERT OR REPLACE INTO kv VALUES(?,?,?)", [(k, v, expires) for k, v in items.items()])

    def ttl(self, key: str) -> float | None:
        rows = self._read(f"SELECT expires FROM kv WHERE key=? AND {_LIVE}", (key, time.time()))
        if not rows or rows[0][0] is None:
            return None
        return max(0.0, float(rows[0][0]) - time.time())

    @staticmethod
    def _put_record(c: sqlite3.Connection, kind: str, id: str, doc: Mapping[str, Any], index: Sequence[str]) -> None:
        c.execute("INSERT OR REPLACE INTO records VALUES(?,?,?)", (kind, id, dump_doc(doc)))
        c.execute("DELETE FROM record_index WHERE kind=? AND id=?", (kind, id))
        if index:
            c.executemany("INSERT INTO record_index VALUES(?,?,?,?)",
                          [(kind, f, v, id) for f, v in index_values(doc, index).items()])

    @staticmethod
    def _delete_record(c: sqlite3.Connection, kind: str, id: str) -> bool:
        c.execute("DELETE FROM record_index WHERE kind=? AND id=?", (kind, id))
        return c.execute("DELETE FROM records WHERE kind=? AND id=?", (kind, id)).rowcount > 0

    def put_record(self, kind: str, id: str, doc: Mapping[str, Any], *, index: Sequence[str] = ()) -> None:
        with self._tx() as c:
            self._put_record(c, kind, id, doc, index)

    def commit_records(self, guard: str, expected: bytes | None, new: bytes, puts: Sequence[RecordWrite],
                       deletes: Sequence[tuple[str, str]] = ()) -> bool:
        with self._tx() as c:
            if expected is not None:  # one statement: the guard moves only from the value it was expected to hold
                if c.execute(f"UPDATE kv SET value=?, expires=NULL WHERE key=? AND value=? AND {_LIVE}",
                             (new, guard, expected, time.time())).rowcount != 1:
                    return False
            else:
                if c.execute(f"SELECT 1 FROM kv WHERE key=? AND {_LIVE}", (guard, time.time())).fetchone():
                    return False
                c.execute("INSERT OR REPLACE INTO kv VALUES(?,?,NULL)", (guard, new))
            if deletes:  # a journal folded into a snapshot deletes hundreds of entries: two statements, not two each
                c.executemany("DELETE FROM record_index WHERE kind=? AND id=?", deletes)
                c.executemany("DELETE FROM records WHERE kind=? AND id=?", deletes)
            for w in puts:
                self._put_record(c, w.kind, w.id, w.doc, w.index)
            return True

    def get_record(self, kind: str, id: str) -> dict[str, Any] | None:
        rows = self._read("SELECT doc FROM records WHERE kind=? AND id=?", (kind, id))
        return load_doc(rows[0][0]) if rows else None

    def find_records(self, kind: str, **where: str) -> list[dict[str, Any]]:
        sql = "SELECT doc FROM records r WHERE kind=?"
        args: list[Any] = [kind]
        for field, value in where.items():
            sql += " AND EXISTS (SELECT 1 FROM record_index i WHERE i.kind=r.kind AND i.id=r.id AND field=? AND value=?)"
            args += [field, str(value)]
        return [load_doc(doc) for (doc,) in self._read(sql + " ORDER BY id", args)]

    def delete_record(self, kind: str, id: str) -> bool:
        with self._tx() as c:
            return self._delete_record(c, kind, id)

    def ping(self) -> None:
        try:
            self._read("SELECT 1", ())
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"sqlite store {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()
