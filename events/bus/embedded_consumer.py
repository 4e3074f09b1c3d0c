"""A consumer-group member of the embedded bus: leases, fetching and fenced commits.

See ``cascade.events.bus.embedded`` for the model. Each consumer has its own SQLite connection;
``PRAGMA data_version`` tells cheaply whether another connection wrote since the last look.
A publisher in any process rings the consumer's doorbell (``cascade.events.bus.wakeup``) after
each commit, so a new record is fetched at once; the consumer still looks every ``RECHECK``
seconds, and without a doorbell (not Linux) it polls every ``poll_interval``.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from cascade.events.bus.base import Record, Start, TopicPartition
from cascade.events.bus.offsets import AckTracker
from cascade.events.bus.sqlite_log import connect, decode_headers
from cascade.events.bus.wakeup import SUPPORTED, Doorbell

if TYPE_CHECKING:
    from cascade.events.bus.embedded import EmbeddedBus

RECHECK = 0.1  # seconds between looks when the doorbell is silent (it rings on every commit)


class EmbeddedConsumer:
    """One member of a consumer group on an :class:`EmbeddedBus`."""

    def __init__(self, bus: EmbeddedBus, topics: list[str], group: str, start: Start) -> None:
        self.bus, self.topics, self.group, self.start = bus, topics, group, start
        self.member = bus.new_member_id()
        self._conn = connect(bus.path, synchronous=bus.synchronous)
        self._tracker = AckTracker()
        self._owned: dict[TopicPartition, int] = {}  # partition -> next offset to fetch
        self._rebalance_every = min(1.0, bus.session_timeout / 3)
        self._last_rebalance = 0.0
        self._last_commit = time.monotonic()
        self._data_version = -1
        self._last_records = time.monotonic()
        self._caught_up = False  # the last fetch read to the end of every owned partition
        self._closed = False
        self._doorbell: Doorbell | None = None
        if SUPPORTED:
            try:
                self._doorbell = Doorbell(bus.path, self.member)  # before joining: a listed member can be rung
            except OSError:
                pass  # poll instead
        for topic in topics:
            bus.ensure_topic(topic)
        self._rebalance()

    # -- group membership -------------------------------------------------------------
    def _rebalance(self) -> None:
        now = time.time()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT OR REPLACE INTO members VALUES(?,?,?)", (self.group, self.member, now))
            conn.execute("DELETE FROM members WHERE grp=? AND seen<?", (self.group, now - self.bus.session_timeout))
            members = [m for (m,) in conn.execute("SELECT member FROM members WHERE grp=? ORDER BY member", (self.group,))]
            parts: list[TopicPartition] = []
            for topic in sorted(self.topics):
                (count,) = conn.execute("SELECT partitions FROM topics WHERE name=?", (topic,)).fetchone()
                parts += [(topic, p) for p in range(int(count))]
            mine = {tp for i, tp in enumerate(parts) if members[i % len(members)] == self.member}
            revoked = [tp for tp in self._owned if tp not in mine]
            self._commit_in(revoked)
            for topic, part in revoked:
                conn.execute("DELETE FROM leases WHERE grp=? AND topic=? AND part=? AND member=?",
                             (self.group, topic, part, self.member))
            self._tracker.forget(revoked)
            owned: dict[TopicPartition, int] = {}
            for tp in sorted(mine):
                row = conn.execute("SELECT member, expires FROM leases WHERE grp=? AND topic=? AND part=?",
                                   (self.group, *tp)).fetchone()
                if row is not None and row[0] != self.member and row[1] > now:
                    continue  # the previous owner has not let go yet
                conn.execute("INSERT OR REPLACE INTO leases VALUES(?,?,?,?,?)",
                             (self.group, *tp, self.member, now + self.bus.session_timeout))
                if tp in self._owned and row is not None and row[0] == self.member:
                    owned[tp] = self._owned[tp]
                else:
                    self._tracker.forget([tp])
                    owned[tp] = self._initial_position(tp)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._owned = owned
        self._last_rebalance = time.monotonic()
        self._data_version = -1  # fetch at once: the assignment may have changed
        self._caught_up = False

    def _initial_position(self, tp: TopicPartition) -> int:
        row = self._conn.execute("SELECT off FROM offsets WHERE grp=? AND topic=? AND part=?",
                                 (self.group, *tp)).fetchone()
        if row is not None:
            return int(row[0])
        if self.start == "earliest":
            (low,) = self._conn.execute("SELECT MIN(off) FROM log WHERE topic=? AND part=?", tp).fetchone()
            position = 0 if low is None else int(low)
        else:
            (high,) = self._conn.execute("SELECT MAX(off) FROM log WHERE topic=? AND part=?", tp).fetchone()
            position = 0 if high is None else int(high) + 1
        self._conn.execute("INSERT INTO offsets VALUES(?,?,?,?)", (self.group, *tp, position))
        return position

    # -- commits ---------------------------------------------------------------------
    def _commit_in(self, tps: list[TopicPartition] | None = None) -> None:
        """Write committable offsets inside the caller's transaction, fenced by our leases."""
        positions = self._tracker.committable(tps)
        for (topic, part), offset in positions.items():
            self._conn.execute(
                "INSERT INTO offsets SELECT ?,?,?,? WHERE EXISTS (SELECT 1 FROM leases WHERE grp=? "
                "AND topic=? AND part=? AND member=?) ON CONFLICT DO UPDATE SET off=MAX(off, excluded.off)",
                (self.group, topic, part, offset, self.group, topic, part, self.member),
            )
        self._tracker.mark_committed(positions)

    def commit(self) -> None:
        if self._closed:
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            self._commit_in()
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._last_commit = time.monotonic()

    def ack(self, record: Record) -> None:
        self._tracker.ack(record.tp, record.offset)

    def assignment(self) -> set[TopicPartition]:
        return set(self._owned)

    # -- fetching --------------------------------------------------------------------
    def _fetch(self, max_records: int) -> list[Record]:
        records: list[Record] = []
        for tp, position in list(self._owned.items()):
            if len(records) >= max_records:
                break
            rows = self._conn.execute(
                "SELECT off, key, headers, value, ts FROM log WHERE topic=? AND part=? AND off>=? "
                "ORDER BY off LIMIT ?", (*tp, position, max_records - len(records))).fetchall()
            for off, key, headers, value, ts in rows:
                records.append(Record(tp[0], tp[1], int(off), key, decode_headers(headers), value, float(ts)))
                self._tracker.delivered(tp, int(off))
            if rows:
                self._owned[tp] = int(rows[-1][0]) + 1
        self._caught_up = len(records) < max_records
        return records

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]:
        deadline = time.monotonic() + timeout
        if self._caught_up and self._doorbell is not None:
            # Everything committed before the last fetch was read, and every commit since rang: wait for the ring
            # before looking. (Looking first is a query whose release of the interpreter lock, right after the
            # caller handed the last records to another thread, cost both threads a switch per event.)
            self._caught_up = False
            self._doorbell.wait(min(RECHECK, timeout, self._rebalance_every))
        while True:
            now = time.monotonic()
            if now - self._last_rebalance >= self._rebalance_every:
                self._rebalance()
            if now - self._last_commit >= self.bus.commit_interval:
                self.commit()
            (version,) = self._conn.execute("PRAGMA data_version").fetchone()
            if version != self._data_version:
                self._data_version = version
                records = self._fetch(max_records)
                if records:
                    self._last_records = time.monotonic()
                    return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            if self._doorbell is not None:
                self._doorbell.wait(min(RECHECK, remaining, self._rebalance_every))
                continue
            # No doorbell: poll other processes' writes every poll_interval while busy; after a second of
            # quiet, five times less often (writes from this process still wake us at once).
            idle = time.monotonic() - self._last_records > 1.0
            self.bus.wait_for_change(min(self.bus.poll_interval * (5 if idle else 1), remaining))

    def close(self) -> None:
        if self._closed:
            return
        self.commit()
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute("DELETE FROM leases WHERE grp=? AND member=?", (self.group, self.member))
        self._conn.execute("DELETE FROM members WHERE grp=? AND member=?", (self.group, self.member))
        self._conn.execute("COMMIT")
        self._closed = True
        self._conn.close()
        if self._doorbell is not None:
            self._doorbell.close()
