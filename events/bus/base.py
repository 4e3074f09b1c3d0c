"""The EventBus plug-in point: one Protocol, the record types, and shared publish logic.

A bus is a partitioned, durable log of :class:`~events.bindings.kafka.WireRecord` values
with consumer groups. Two implementations ship: Kafka (``cascade.events.bus.kafka``) and an
embedded SQLite log (``cascade.events.bus.embedded``); both pass ``tests/contract``.

Guarantees every implementation gives:

* ``publish`` returns only after the records are durable (Kafka ``acks=all``; SQLite commit).
* Records with the same key land in one partition, in publish order.
* A consumer group shares partitions among its live consumers; offsets are committed only
  for the contiguous acknowledged prefix (periodically, on revoke and on close), so a
  consumer that dies without acknowledging causes redelivery, never loss.
* A group with no committed offset starts at ``latest`` or ``earliest`` and commits that
  position at once, so recreating a consumer resumes where the group stood.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from cloudevents.http import CloudEvent

from cascade.events.bindings.kafka import Headers, WireRecord, from_wire, to_wire

Start = Literal["latest", "earliest"]
TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Position:
    """Where a published record landed."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """A record handed to a consumer; ``ack`` it (on the consumer) when processed."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    headers: Headers
    value: bytes
    timestamp: float

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def wire(self) -> WireRecord:
        return WireRecord(self.key, self.headers, self.value)

    def event(self) -> CloudEvent:
        """Decode the CloudEvent; raises InvalidEvent for records that are not one."""
        return from_wire(self.wire)


class Consumer(Protocol):
    """A member of a consumer group. ``poll``/``commit``/``close`` from one thread; ``ack`` from any."""

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[Record]: ...

    def ack(self, record: Record) -> None: ...

    def commit(self) -> None: ...

    def assignment(self) -> set[TopicPartition]: ...

    def close(self) -> None: ...


class EventBus(Protocol):
    """A durable, partitioned event log with consumer groups."""

    def append(self, topic: str, records: Sequence[WireRecord]) -> list[Position]:
        """Store raw records durably; returns once every one is durable."""
        ...

    def publish(self, topic: str, event: CloudEvent) -> Position: ...

    def publish_many(self, topic: str, events: Sequence[CloudEvent]) -> list[Position]: ...

    def subscribe(self, topics: Sequence[str], group: str, *, start: Start = "latest") -> Consumer: ...

    def ensure_topic(self, topic: str, partitions: int | None = None) -> None: ...

    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset to be written, per partition."""
        ...

    def committed(self, topic: str, group: str) -> dict[int, int]:
        """The group's committed offsets, per partition (missing: none committed)."""
        ...

    def seed_group(self, topic: str, group: str) -> None:
        """Where ``group`` has no committed offset on a partition of ``topic``, commit the partition's
        end: a group created now starts at now whenever its first member joins, so events
        published in between are not skipped. Partitions with an offset are left alone."""
        ...

    def ping(self, timeout: float = 2.0) -> None:
        """Raise BusUnavailable unless the bus answers within ``timeout`` seconds."""
        ...

    def close(self) -> None: ...


class BusBase:
    """Publishing in terms of ``append``; both buses inherit it."""

    def append(self, topic: str, records: Sequence[WireRecord]) -> list[Position]:
        raise NotImplementedError

    def publish(self, topic: str, event: CloudEvent) -> Position:
        return self.append(topic, [to_wire(event)])[0]

    def publish_many(self, topic: str, events: Sequence[CloudEvent]) -> list[Position]:
        return self.append(topic, [to_wire(e) for e in events])
