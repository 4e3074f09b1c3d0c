"""Which offset a consumer may commit: the end of the contiguous acknowledged prefix.

Records are handed out in offset order per partition but may be acknowledged in any order
(unordered delivery runs handlers concurrently). Committing past an unfinished record would
lose it on a crash, so, like Knative's OffsetManager, only the prefix in which every record
is acknowledged is committable. Gaps in offsets (compaction, control records) are fine:
only offsets actually handed out are waited for.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from cascade.events.bus.base import TopicPartition


class _Partition:
    __slots__ = ("outstanding", "acked", "next", "committed")

    def __init__(self) -> None:
        self.outstanding: deque[int] = deque()
        self.acked: set[int] = set()
        self.next = -1  # offset after the last record handed out
        self.committed = -1


class AckTracker:
    """Thread-safe bookkeeping of handed-out and acknowledged offsets per partition."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[TopicPartition, _Partition] = {}

    def delivered(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            part = self._parts.get(tp)
            if part is None:  # not setdefault: that would build a _Partition for every record
                part = self._parts[tp] = _Partition()
            if offset < part.next:  # re-fetched after a seek: start over from here
                part.outstanding.clear()
                part.acked.clear()
            part.outstanding.append(offset)
            part.next = offset + 1

    def ack(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            part = self._parts.get(tp)
            if part is None or offset >= part.next or not part.outstanding or offset < part.outstanding[0]:
                return  # revoked since, never handed out, or acknowledged already
            part.acked.add(offset)
            while part.outstanding and part.outstanding[0] in part.acked:
                part.acked.discard(part.outstanding.popleft())

    def committable(self, tps: Iterable[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Offsets to commit (next offset to read) that moved since the last commit."""
        with self._lock:
            wanted = self._parts.keys() if tps is None else [tp for tp in tps if tp in self._parts]
            result: dict[TopicPartition, int] = {}
            for tp in wanted:
                part = self._parts[tp]
                position = part.outstanding[0] if part.outstanding else part.next
                if position > part.committed:
                    result[tp] = position
            return result

    def mark_committed(self, positions: dict[TopicPartition, int]) -> None:
        with self._lock:
            for tp, offset in positions.items():
                if tp in self._parts:
                    self._parts[tp].committed = max(self._parts[tp].committed, offset)

    def resume_at(self, tp: TopicPartition) -> int:
        """The offset after the last record handed out on ``tp``, or -1 if none was (or it was forgotten)."""
        with self._lock:
            part = self._parts.get(tp)
            return part.next if part is not None else -1

    def in_flight(self) -> int:
        with self._lock:
            return sum(len(p.outstanding) for p in self._parts.values())

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                self._parts.pop(tp, None)
