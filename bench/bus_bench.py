"""Bus benchmarks: publish throughput and publish->consume latency, each bus beside raw kafka-python.

Run by hand with Kafka up (scripts/services.sh start):  .venv/bin/python -m bench.bus_bench
Prints one table; ratios compare against the raw kafka-python producer/consumer measured in
the same run on the same broker.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from bench.common import paced, percentile, table
from cascade.events.bindings.kafka import to_wire
from cascade.events.bus import EventBus
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.bus.kafka import KafkaBus
from cascade.events.envelope import new_event

KAFKA = "127.0.0.1:9092"


def events(n: int) -> list:  # type: ignore[type-arg]
    return [new_event("job.cancelled", {"jobId": f"job-{i % 64}", "reason": "bench"}, source="/bench",
                      partitionkey=f"job-{i % 64}") for i in range(n)]


def fresh_topic(partitions: int = 4) -> str:
    name = f"bench-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=KAFKA)
    admin.create_topics([NewTopic(name, partitions, 1)])
    admin.close()
    return name


def raw_producer() -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=KAFKA, acks="all", enable_idempotence=True, linger_ms=0)


def raw_throughput(n: int) -> float:
    wires = [to_wire(e) for e in events(n)]
    producer, topic = raw_producer(), fresh_topic()
    producer.send(topic, b"warm").get()
    start = time.perf_counter()
    futures = [producer.send(topic, key=w.key, value=w.value, headers=list(w.headers)) for w in wires]
    for f in futures:
        f.get()
    rate = n / (time.perf_counter() - start)
    producer.close()
    return rate


def bus_throughput(bus: EventBus, n: int, topic: str) -> float:
    evs = events(n)
    bus.publish(topic, evs[0])  # connect and create the topic outside the timing
    start = time.perf_counter()
    for i in range(0, n, 1000):
        bus.publish_many(topic, evs[i:i + 1000])
    return n / (time.perf_counter() - start)


def raw_single(n: int) -> float:
    producer, topic = raw_producer(), fresh_topic()
    wires = [to_wire(e) for e in events(n)]
    producer.send(topic, b"warm").get()
    start = time.perf_counter()
    for w in wires:
        producer.send(topic, key=w.key, value=w.value, headers=list(w.headers)).get()
    rate = n / (time.perf_counter() - start)
    producer.close()
    return rate


def bus_single(bus: EventBus, n: int, topic: str) -> float:
    evs = events(n)
    bus.publish(topic, evs[0])
    start = time.perf_counter()
    for e in evs:
        bus.publish(topic, e)
    return n / (time.perf_counter() - start)


def measure_latency(send: Callable[[int], None], receive_loop: Callable[[dict[int, float], threading.Event], None],
                    rate: float, count: int, sent: dict[int, float]) -> list[float]:
    received: dict[int, float] = {}
    stop = threading.Event()
    consumer = threading.Thread(target=receive_loop, args=(received, stop), daemon=True)
    consumer.start()
    time.sleep(0.5)
    paced(rate, count, send)
    deadline = time.monotonic() + 30
    while len(received) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    consumer.join(timeout=10)
    return [(received[i] - sent[i]) * 1000 for i in received if i in sent]


def raw_latency(rate: float, count: int) -> list[float]:
    topic, producer = fresh_topic(), raw_producer()
    producer.send(topic, b"warm").get()
    sent: dict[int, float] = {}
    ready = threading.Event()

    def loop(received: dict[int, float], stop: threading.Event) -> None:
        consumer = KafkaConsumer(topic, bootstrap_servers=KAFKA, group_id=f"raw-{topic}", auto_offset_reset="latest",
                                 enable_auto_commit=False, fetch_max_wait_ms=100)
        while not consumer.assignment():
            consumer.poll(100)
        ready.set()
        while not stop.is_set():
            for msgs in consumer.poll(100).values():
                now = time.perf_counter()
                for m in msgs:
                    if m.key and m.key.isdigit():
                        received[int(m.key)] = now
        consumer.close()

    def send(i: int) -> None:
        ready.wait(30)
        sent[i] = time.perf_counter()
        producer.send(topic, key=str(i).encode(), value=b'{"jobId":"x"}')

    result = measure_latency(send, loop, rate, count, sent)
    producer.close()
    return result


def bus_latency(bus: EventBus, rate: float, count: int, threads: int) -> list[float]:
    topic = f"bench-{uuid.uuid4().hex[:10]}"
    bus.ensure_topic(topic)
    sent: dict[int, float] = {}
    ready = threading.Event()
    pool = ThreadPoolExecutor(threads)
    evs = [new_event("job.cancelled", {"jobId": str(i)}, source="/bench", id=str(i), partitionkey=f"k{i % 64}")
           for i in range(count)]

    def loop(received: dict[int, float], stop: threading.Event) -> None:
        consumer = bus.subscribe([topic], f"lat-{topic}", start="latest")
        while not consumer.assignment():
            consumer.poll(0.1)
        ready.set()
        while not stop.is_set():
            for record in consumer.poll(0.1):
                now = time.perf_counter()
                received[int(record.event()["id"])] = now
                consumer.ack(record)
        consumer.close()

    def publish(i: int) -> None:
        sent[i] = time.perf_counter()
        bus.publish(topic, evs[i])

    def send(i: int) -> None:
        ready.wait(30)
        if threads == 1:
            publish(i)
        else:
            pool.submit(publish, i)

    result = measure_latency(send, loop, rate, count, sent)
    pool.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20000, help="events per throughput run")
    parser.add_argument("--rate", type=float, default=1000.0, help="events per second in latency runs")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each latency run")
    args = parser.parse_args()
    count = int(args.rate * args.seconds)
    tmp = tempfile.mkdtemp(prefix="cascade-bench-")
    kafka = KafkaBus(KAFKA)
    embedded = EmbeddedBus(f"{tmp}/bus.db")

    raw_batch = raw_throughput(args.events)
    raw_one = raw_single(args.events // 10)
    k_batch = bus_throughput(kafka, args.events, f"bench-{uuid.uuid4().hex[:8]}")
    k_one = bus_single(kafka, args.events // 10, f"bench-{uuid.uuid4().hex[:8]}")
    e_batch = bus_throughput(embedded, args.events, "bench-batch")
    e_one = bus_single(embedded, args.events // 10, "bench-single")
    rows = [
        ["raw kafka-python producer", "pipelined", raw_batch, 1.0],
        ["cascade KafkaBus.publish_many", "pipelined", k_batch, k_batch / raw_batch],
        ["cascade EmbeddedBus.publish_many", "pipelined", e_batch, e_batch / raw_batch],
        ["raw kafka-python send().get()", "one at a time", raw_one, 1.0],
        ["cascade KafkaBus.publish", "one at a time", k_one, k_one / raw_one],
        ["cascade EmbeddedBus.publish", "one at a time", e_one, e_one / raw_one],
    ]
    print(table(f"Publish throughput (events/s, durable; {args.events} events; ratio vs raw kafka-python)",
                ["publisher", "mode", "events/s", "ratio"], rows))
    print()
    raw = raw_latency(args.rate, count)
    k = bus_latency(kafka, args.rate, count, threads=8)
    e = bus_latency(embedded, args.rate, count, threads=1)
    base50 = percentile(raw, 50)
    lrows = [[name, len(v), percentile(v, 50), percentile(v, 99), percentile(v, 50) / base50]
             for name, v in (("raw kafka-python", raw), ("cascade KafkaBus", k), ("cascade EmbeddedBus", e))]
    print(table(f"Publish -> consume latency (ms) at {args.rate:.0f} events/s for {args.seconds:.0f}s; "
                "ratio = p50 vs raw kafka-python", ["bus", "events", "p50", "p99", "p50 ratio"], lrows))
    kafka.close()
    embedded.close()


if __name__ == "__main__":
    main()
