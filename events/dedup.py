"""Remember which webhook / notification deliveries were published, so retries publish nothing.

Sources retry deliveries (S3 and CVAT do; MinIO queues them across our restarts). Their
event ids are derived from the source's own ids, so a retry yields the same ``(source, id)``
and this log drops it. Every key starts with the event's Cascade project, so two projects'
deliveries never collide even when their tools number things alike.

The log is bounded by size, not by a clock: each project keeps its last ``capacity``
deliveries in a ring (slot ``n % capacity`` names the key it holds; writing a slot forgets
the delivery it held), so an old delivery is forgotten only after ``capacity`` newer ones,
never because a day passed. The mark is written after the publish: a crash in between can
publish twice, and the dispatcher's idempotency records absorb that (at-least-once,
effectively once).
"""

from __future__ import annotations

from collections.abc import Sequence

from cloudevents.http import CloudEvent

from cascade.stores import StateStore


class DeliveryLog:
    def __init__(self, store: StateStore, capacity: int = 100_000) -> None:
        self.store, self.capacity = store, max(1, capacity)

    @staticmethod
    def _project(event: CloudEvent) -> str:
        return str(event.get("project") or "default")

    def _key(self, event: CloudEvent) -> str:
        return f"delivered:{self._project(event)}:{event['source']}:{event['id']}"

    def fresh(self, events: Sequence[CloudEvent]) -> list[CloudEvent]:
        """The events not published before (nor twice in ``events``)."""
        out, keys = [], set()
        for event in events:
            key = self._key(event)
            if key not in keys and self.store.get(key) is None:
                out.append(event)
            keys.add(key)
        return out

    def remember(self, events: Sequence[CloudEvent]) -> None:
        for event in events:
            key = self._key(event)
            slot = f"delivered-ring:{self._project(event)}:{self._next(self._project(event)) % self.capacity}"
            old = self.store.get(slot)
            if old is not None and old.decode() != key:
                self.store.delete(old.decode())
            self.store.put(slot, key.encode())
            self.store.put(key, b"1")

    def _next(self, project: str) -> int:
        """This project's delivery counter, incremented atomically (several gateways share it)."""
        counter = f"delivered-count:{project}"
        while True:
            current = self.store.get(counter)
            n = int(current or b"0")
            if self.store.cas(counter, current, str(n + 1).encode()):
                return n
