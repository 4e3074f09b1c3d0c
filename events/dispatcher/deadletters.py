"""Dead letters: the original record plus Knative-style error extensions, and their replay.

A dead letter keeps the original key, headers and value, so it is the same CloudEvent,
with extensions ``knativeerrordest`` (subscriber), ``knativeerrorcode`` (last HTTP status),
``knativeerrordata`` (truncated error body or reason), ``cascadetrigger`` and
``cascadeattempts``. ``replay`` moves a trigger's dead letters to its retry topic, which
only that trigger consumes, with ``cascadereplay`` counting replays (a replayed event is a
new delivery for the idempotency records).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from cascade.core.errors import InvalidEvent, RetryableError
from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus import EventBus, Record
from cascade.events.triggers import Trigger

ERROR_HEADERS = ("ce_knativeerrordest", "ce_knativeerrorcode", "ce_knativeerrordata", "ce_cascadetrigger",
                 "ce_cascadeattempts")


def dead_letter(record: WireRecord, trigger: str, dest: str, code: int | None, error: str, attempts: int) -> WireRecord:
    kept = tuple((k, v) for k, v in record.headers if k not in ERROR_HEADERS)
    extra = (("ce_knativeerrordest", dest.encode()), ("ce_knativeerrorcode", str(code or 0).encode()),
             ("ce_knativeerrordata", error.encode()[:1024]), ("ce_cascadetrigger", trigger.encode()),
             ("ce_cascadeattempts", str(attempts).encode()))
    return WireRecord(record.key, kept + extra, record.value)


@dataclass(frozen=True)
class Letter:
    record: Record

    def header(self, name: str) -> str:
        value = self.record.wire.header(name)
        return value.decode("utf-8", "replace") if value is not None else ""

    def summary(self) -> dict[str, str]:
        try:
            event = self.record.event()
            ident, etype = str(event["id"]), str(event["type"])
        except InvalidEvent:
            ident, etype = "-", "(not a CloudEvent)"
        return {"offset": f"{self.record.partition}/{self.record.offset}", "id": ident, "type": etype,
                "code": self.header("ce_knativeerrorcode"), "dest": self.header("ce_knativeerrordest"),
                "error": self.header("ce_knativeerrordata")[:120], "attempts": self.header("ce_cascadeattempts")}


def read_to_end(bus: EventBus, topic: str, group: str, timeout: float,
              handle: Callable[[list[Record]], None] = lambda records: None) -> list[Record]:
    """Read ``topic`` from the group's position to the current end; ``handle`` each batch before acking it."""
    ends = {p: end for p, end in bus.end_offsets(topic).items()}
    reached = dict(bus.committed(topic, group))
    consumer = bus.subscribe([topic], group, start="earliest")
    got: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        while any(reached.get(p, 0) < end for p, end in ends.items()):
            if time.monotonic() > deadline:
                raise RetryableError(f"reading {topic} did not reach its end within {timeout}s")
            batch = [r for r in consumer.poll(0.2) if r.offset < ends.get(r.partition, 0)]
            handle(batch)
            for record in batch:
                consumer.ack(record)
                reached[record.partition] = max(reached.get(record.partition, 0), record.offset + 1)
            got += batch
    finally:
        consumer.close()
    return got


def list_letters(bus: EventBus, trigger: Trigger, timeout: float = 10.0) -> list[Letter]:
    """Every dead letter of ``trigger`` (read with a throwaway group)."""
    records = read_to_end(bus, trigger.dead_letter_topic, f"cascade.dlq-view.{uuid.uuid4().hex}", timeout)
    return [Letter(r) for r in sorted(records, key=lambda r: (r.timestamp, r.partition, r.offset))]


def replay(bus: EventBus, trigger: Trigger, topic: str = "cascade.events", timeout: float = 30.0) -> int:
    """Send the trigger's not-yet-replayed dead letters to it again; returns how many."""

    def send(records: list[Record]) -> None:
        again = []
        for record in records:
            wire = record.wire
            count = int((wire.header("ce_cascadereplay") or b"0").decode() or 0) + 1
            headers = tuple((k, v) for k, v in wire.headers if k not in ERROR_HEADERS and k != "ce_cascadereplay")
            again.append(WireRecord(wire.key, headers + (("ce_cascadereplay", str(count).encode()),), wire.value))
        if again:
            bus.append(trigger.retry_topic(topic), again)

    return len(read_to_end(bus, trigger.dead_letter_topic, f"cascade.dlq-replay.{trigger.name}", timeout, send))
