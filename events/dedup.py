"""Remember which webhook / notification deliveries were published, so retries publish nothing.

Sources retry deliveries (S3, Label Studio and CVAT all do). Their event ids are derived
from the source's own ids, so a retry yields the same ``(source, id)``; this log drops it.
The mark is written after the publish: a crash in between can publish twice, and the
dispatcher's idempotency records absorb that (at-least-once, effectively once).
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudevents.http import CloudEvent

from cascade.stores import StateStore


class DeliveryLog:
    def __init__(self, store: StateStore, ttl: float = 86400.0) -> None:
        self.store, self.ttl = store, ttl

    @staticmethod
    def _key(event: CloudEvent) -> str:
        return f"delivered:{event['source']}:{event['id']}"

    def fresh(self, events: Sequence[CloudEvent]) -> list[CloudEvent]:
        """The events not published before."""
        return [e for e in events if self.store.get(self._key(e)) is None]

    def remember(self, events: Sequence[CloudEvent]) -> None:
        for event in events:
            self.store.put(self._key(event), b"1", ttl=self.ttl)
