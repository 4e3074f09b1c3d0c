"""The Kafka bus places keys as Kafka's Java client and kafka-python do (murmur2), so a key published by this
release lands on the partition that earlier releases, and other clients, put it on: per-key order holds."""

from __future__ import annotations

from kafka.partitioner.default import murmur2

from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus.kafka import KafkaBus
from tests.conftest import KAFKA


def test_keys_land_on_the_partitions_the_java_client_and_kafka_python_choose(topic: str) -> None:
    bus = KafkaBus(KAFKA, partitions=7)
    try:
        keys = [f"key-{i}".encode() for i in range(40)] + [b"cats", b"job-1", "ä".encode()]
        positions = bus.append(topic, [WireRecord(k, (), b"{}") for k in keys])
        assert [p.partition for p in positions] == [(murmur2(k) & 0x7FFFFFFF) % 7 for k in keys]
        assert len({p.partition for p in positions}) > 3, "the keys spread over the partitions"
    finally:
        bus.close()
