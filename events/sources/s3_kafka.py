"""S3 notifications that arrive on a Kafka topic (MinIO's Kafka target) -> ``dataset.uploaded``.

MinIO can publish bucket notifications straight to Kafka; this source consumes that topic
as a consumer group, converts each record with the same code as the ``/webhooks/s3``
route, publishes, and only then acknowledges. Records that are not S3 notifications go to
the dead-letter topic with the reason instead of blocking the partition.
"""

from __future__ import annotations

import json
import threading

from cascade.core.errors import InvalidInput
from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus import EventBus
from cascade.events.dedup import DeliveryLog
from cascade.events.gateway.webhooks import s3_events
from cascade.stores import StateStore

DEAD_LETTERS = "cascade.deadletter"


class S3KafkaSource:
    def __init__(self, bus: EventBus, store: StateStore, *, notifications: str, topic: str = "cascade.events",
                 project: str = "default", group: str = "cascade-s3-source", dedup_capacity: int = 100_000,
                 dead_letters: str = DEAD_LETTERS) -> None:
        self.bus, self.store, self.notifications, self.topic = bus, store, notifications, topic
        self.project, self.group, self.dead_letters = project, group, dead_letters
        self.deliveries = DeliveryLog(store, dedup_capacity)
        self._stop = threading.Event()

    def run(self, *, start: str = "earliest") -> None:
        consumer = self.bus.subscribe([self.notifications], self.group, start="earliest" if start == "earliest" else "latest")
        try:
            while not self._stop.is_set():
                for record in consumer.poll(0.5):
                    self.handle(record.value)
                    consumer.ack(record)
        finally:
            consumer.close()

    def handle(self, value: bytes) -> int:
        """Publish the events for one notification record; returns how many were new."""
        try:
            events, _ = s3_events(json.loads(value), self.project)
        except (ValueError, InvalidInput) as exc:
            reason = exc.message if isinstance(exc, InvalidInput) else f"not JSON: {exc}"
            self.bus.append(self.dead_letters, [WireRecord(None, (("cascade-reason", reason.encode()),
                                                              ("cascade-origin", self.notifications.encode())), value)])
            return 0
        fresh = self.deliveries.fresh(events)
        if fresh:
            self.bus.publish_many(self.topic, fresh)
        self.deliveries.remember(fresh)
        return len(fresh)

    def stop(self) -> None:
        self._stop.set()
