"""The embedded bus: a durable, partitioned append-only log in one SQLite file (WAL mode).

Cascade's laptop default needs no broker, yet must keep Kafka's contract: partitions by key,
consumer groups with committed offsets, several processes on one machine, no loss across a
restart. Group membership is a table of heartbeats; each live member owns the partitions a
deterministic round-robin gives it, through a lease it renews while polling. A member that
stops polling for ``session_timeout`` seconds loses its leases and its uncommitted records
go to whoever takes the partition over. Commits are fenced: a member that lost a lease
cannot move that partition's offset.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from cascade.core.errors import BusUnavailable
from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus.base import BusBase, Consumer, Position, Start
from cascade.events.bus.embedded_consumer import EmbeddedConsumer
from cascade.events.bus.sqlite_log import SCHEMA, connect, encode_headers
from cascade.events.bus.wakeup import Ringer


class EmbeddedBus(BusBase):
    """An EventBus over one SQLite file; safe across threads and processes."""

    def __init__(
        self,
        path: str | Path,
        *,
        partitions: int = 4,
        synchronous: str = "FULL",
        session_timeout: float = 10.0,
        commit_interval: float = 0.5,
        poll_interval: float = 0.001,
    ) -> None:
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.partitions = partitions
        self.synchronous = synchronous
        self.session_timeout = session_timeout
        self.commit_interval = commit_interval
        self.poll_interval = poll_interval
        self._lock = threading.Lock()
        self._conn = connect(self.path, synchronous=synchronous)
        self._conn.executescript(SCHEMA)
        self._changed = threading.Condition()
        self._ringer = Ringer(self.path)
        self._round_robin = 0

    def _tx(self) -> sqlite3.Connection:
        self._conn.execute("BEGIN IMMEDIATE")
        return self._conn

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction under the lock; any SQLite error (a full disk, a read-only file,
        an I/O error) rolls back and leaves as BusUnavailable: nothing of it was stored."""
        with self._lock:
            try:
                conn = self._tx()
            except sqlite3.Error as exc:
                raise BusUnavailable(f"embedded bus {self.path}: {what}: {exc}") from exc
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException as exc:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite rolled back already (a full disk does)
                if isinstance(exc, sqlite3.Error):
                    raise BusUnavailable(f"embedded bus {self.path}: {what}: {exc}") from exc
                raise

    def _partitions(self, conn: sqlite3.Connection, topic: str, wanted: int | None = None) -> int:
        row = conn.execute("SELECT partitions FROM topics WHERE name=?", (topic,)).fetchone()
        if row:
            return int(row[0])
        count = wanted or self.partitions
        conn.execute("INSERT OR IGNORE INTO topics VALUES(?, ?)", (topic, count))
        return count

    def ensure_topic(self, topic: str, partitions: int | None = None) -> None:
        with self._write(f"create topic {topic}") as conn:
            self._partitions(conn, topic, partitions)

    def append(self, topic: str, records: Sequence[WireRecord]) -> list[Position]:
        now = time.time()
        positions: list[Position] = []
        with self._write(f"publish to {topic}") as conn:
            count = self._partitions(conn, topic)
            heads: dict[int, int] = {}
            for rec in records:
                if rec.key is None:
                    part = self._round_robin % count
                    self._round_robin += 1
                else:
                    part = zlib.crc32(rec.key) % count
                if part not in heads:
                    row = conn.execute(
                        "SELECT MAX(off) FROM log WHERE topic=? AND part=?", (topic, part)
                    ).fetchone()
                    heads[part] = -1 if row[0] is None else int(row[0])
                heads[part] += 1
                conn.execute(
                    "INSERT INTO log VALUES(?,?,?,?,?,?,?)",
                    (topic, part, heads[part], rec.key, encode_headers(rec.headers), rec.value, now),
                )
                positions.append(Position(topic, part, heads[part]))
            members = [m for (m,) in conn.execute("SELECT DISTINCT member FROM members")]
        self._ringer.ring(members)  # consumers in every process, at once
        with self._changed:
            self._changed.notify_all()
        return positions

    def wait_for_change(self, timeout: float) -> None:
        """Sleep until a publish in this process, or ``timeout`` (for consumers without a doorbell)."""
        with self._changed:
            self._changed.wait(timeout)

    def subscribe(self, topics: Sequence[str], group: str, *, start: Start = "latest") -> Consumer:
        return EmbeddedConsumer(self, list(topics), group, start)

    def end_offsets(self, topic: str) -> dict[int, int]:
        with self._lock:
            count = self._partitions(self._conn, topic)
            rows = dict(self._conn.execute(
                "SELECT part, MAX(off) + 1 FROM log WHERE topic=? GROUP BY part", (topic,)
            ).fetchall())
        return {p: int(rows.get(p, 0)) for p in range(count)}

    def seed_group(self, topic: str, group: str) -> None:
        with self._write(f"seed {group}") as conn:
            for part in range(self._partitions(conn, topic)):
                (high,) = conn.execute("SELECT MAX(off) FROM log WHERE topic=? AND part=?", (topic, part)).fetchone()
                conn.execute("INSERT OR IGNORE INTO offsets VALUES(?,?,?,?)",
                             (group, topic, part, 0 if high is None else int(high) + 1))

    def committed(self, topic: str, group: str) -> dict[int, int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT part, off FROM offsets WHERE grp=? AND topic=?", (group, topic)
            ).fetchall()
        return {int(p): int(o) for p, o in rows}

    def ping(self, timeout: float = 2.0) -> None:
        try:
            with self._lock:
                self._conn.execute("SELECT 1").fetchone()
        except sqlite3.Error as exc:
            raise BusUnavailable(f"embedded bus {self.path}: {exc}") from exc

    def new_member_id(self) -> str:
        return uuid.uuid4().hex

    def close(self) -> None:
        with self._lock:
            self._conn.close()
        self._ringer.close()


