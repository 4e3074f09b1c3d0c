"""Event buses behind one Protocol: Kafka for clusters, an embedded SQLite log for laptops.

``open_bus(url)``: ``kafka://host:port[,host:port]`` or ``embedded:///path/bus.db``
(``embedded://relative/path.db`` for a path relative to the working directory).
"""

from __future__ import annotations

from typing import Any

from cascade.core.errors import InvalidInput
from cascade.events.bus.base import Consumer, EventBus, Position, Record, Start, TopicPartition

__all__ = ["Consumer", "EventBus", "Position", "Record", "Start", "TopicPartition", "open_bus"]


def open_bus(url: str, **options: Any) -> EventBus:
    """Build the bus a URL names; ``options`` go to its constructor (partitions, timeouts...)."""
    if url.startswith("kafka://"):
        from cascade.events.bus.kafka import KafkaBus

        return KafkaBus(url[len("kafka://"):].rstrip("/"), **options)
    if url.startswith("embedded://"):
        from cascade.events.bus.embedded import EmbeddedBus

        return EmbeddedBus(url[len("embedded://"):], **options)
    raise InvalidInput(f"bus URL {url!r}: use kafka://HOST:PORT or embedded:///PATH/bus.db", field="bus")
