"""Group commit: many concurrent publishers, one durable append.

The gateway answers 202 only once an event is durable, so every request waits for the bus.
Appending request by request pays a Kafka round trip or an SQLite fsync each time; under
load this collector hands everything that queued up meanwhile to a single ``append`` per
topic and wakes each waiter when its records are durable. Latency at low load is one
append, as before; throughput under load is that of batched appends. A bus that batches in
its own client (``append_async``: Kafka's librdkafka producer) is handed each publish at once.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future

from cloudevents.http import CloudEvent

from cascade.events.bindings.kafka import WireRecord, to_wire
from cascade.events.bus.base import EventBus, Position

_Item = tuple[str, list[WireRecord], "Future[list[Position]]"]


class GroupCommitter:
    """Coalesces concurrent publishes into one ``append`` per topic (one writer thread)."""

    def __init__(self, bus: EventBus, *, max_records: int = 5000) -> None:
        self.bus, self.max_records = bus, max_records
        # A bus whose client batches on its own (Kafka's librdkafka producer) takes each publish at once instead.
        self._direct: Callable[[str, Sequence[WireRecord]], Awaitable[list[Position]]] | None = \
            getattr(bus, "append_async", None)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="cascade-group-commit", daemon=True)
        self._thread.start()

    def submit(self, topic: str, events: Sequence[CloudEvent]) -> Future[list[Position]]:
        future: Future[list[Position]] = Future()
        self._queue.put((topic, [to_wire(e) for e in events], future))
        return future

    def publish(self, topic: str, events: Sequence[CloudEvent]) -> list[Position]:
        """Block until the events are durable."""
        if self._direct is not None:
            return self.bus.append(topic, [to_wire(e) for e in events])
        return self.submit(topic, events).result()

    async def publish_async(self, topic: str, events: Sequence[CloudEvent]) -> list[Position]:
        """Await durability without holding a thread of the event loop's pool."""
        if self._direct is not None:
            return await self._direct(topic, [to_wire(e) for e in events])
        return await asyncio.wrap_future(self.submit(topic, events))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, count = [item], len(item[1])
            while count < self.max_records:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
                count += len(nxt[1])
            self._commit(batch)

    def _commit(self, batch: list[_Item]) -> None:
        by_topic: dict[str, list[_Item]] = {}
        for item in batch:
            by_topic.setdefault(item[0], []).append(item)
        for topic, items in by_topic.items():
            records = [r for _, recs, _ in items for r in recs]
            try:
                positions = self.bus.append(topic, records)
            except BaseException as exc:  # every waiter learns of the failure
                for _, _, future in items:
                    future.set_exception(exc)
                continue
            start = 0
            for _, recs, future in items:
                future.set_result(positions[start:start + len(recs)])
                start += len(recs)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
