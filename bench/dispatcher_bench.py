"""Dispatcher benchmarks: publish -> subscriber-start latency, and delivery throughput.

Latency at a fixed rate on Kafka and on the embedded bus (dispatcher in its own process,
subscriber in this one). Throughput: a no-op HTTP subscriber against the raw kafka-python
consumer reading the same topic, in the same run (and the raw librdkafka consumer the dispatcher
reads with, for scale); and the subscriber's own ceiling on this
machine, wrk (or ``hey``) posting the same CloudEvent to it over as many connections as the
dispatcher uses (no dispatcher can deliver faster than the subscriber answers). Needs Kafka and Redis up.
Run:  .venv/bin/python -m bench.dispatcher_bench
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import confluent_kafka
import httpx
from kafka import KafkaConsumer

from bench.common import paced, percentile, table
from bench.gateway_bench import hey_path, serve, wrk
from cascade.core.loops import new_loop
from cascade.core.ports import free_port
from cascade.events.bindings import http as ce_http
from cascade.events.bus import open_bus
from cascade.events.dispatcher.http import AsyncHTTP
from cascade.events.envelope import new_event

KAFKA = "127.0.0.1:9092"
REDIS = "redis://127.0.0.1:6379/0"


def dispatcher(home: Path, bus_url: str, state_url: str, topic: str, url: str, metrics: int,
               concurrency: int) -> subprocess.Popen[bytes]:
    triggers = home / "bench.triggers.yaml"
    triggers.write_text(f"triggers:\n- name: {topic}-t\n  subscriber: {url}\n  start: earliest\n"
                        f"  concurrency: {concurrency}\n")
    env = {**os.environ, "CASCADE_HOME": str(home), "CASCADE_BUS__URL": bus_url, "CASCADE_BUS__TOPIC": topic,
           "CASCADE_STATE__URL": state_url, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, "-m", "cascade.cli", "dispatcher", "--triggers", str(triggers),
                             "--metrics-port", str(metrics)], env=env, stdout=subprocess.DEVNULL)


# One client for the bench's polling: ``httpx.get`` builds a client (and loads the CA bundle) per call, which cost
# this process about a third of a core while it watched the dispatchers, on the cores they were measured on.
_poller = httpx.Client(timeout=30)


def delivered(metrics: int, trigger: str) -> int:
    try:
        text = _poller.get(f"http://127.0.0.1:{metrics}/metrics").text
    except httpx.HTTPError:
        return 0
    match = re.search(rf'cascade_trigger_delivered_total{{trigger="{re.escape(trigger)}"}} ([\d.e+]+)', text)
    return int(float(match.group(1))) if match else 0


def latency(bus_url: str, state_url: str, rate: float, count: int) -> list[float]:
    """Milliseconds from publishing each event to its arrival at a subscriber in its own process (uvicorn), so
    that neither stamp waits for the other's work."""
    home = Path(tempfile.mkdtemp(prefix="cascade-disp-bench-"))
    if bus_url.startswith("embedded"):
        bus_url = f"embedded://{home}/bus.db"
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    bus = open_bus(bus_url)
    bus.ensure_topic(topic)
    server, port = serve("bench.latency_subscriber", {})

    def arrived() -> dict[str, float]:
        return dict(_poller.get(f"http://127.0.0.1:{port}/").json())

    metrics = free_port()
    proc = dispatcher(home, bus_url, state_url, topic, f"http://127.0.0.1:{port}/l", metrics, 64)
    sent: dict[str, float] = {}
    try:
        bus.publish(topic, new_event("job.cancelled", {"jobId": "warm"}, source="/bench", id="warm"))
        deadline = time.monotonic() + 60
        while "warm" not in arrived():
            assert time.monotonic() < deadline, "dispatcher did not start"
            time.sleep(0.05)
        events = [new_event("job.cancelled", {"jobId": f"j{i}"}, source="/bench", id=f"e{i}", partitionkey=f"k{i % 64}")
                  for i in range(count)]

        def send(i: int) -> None:
            sent[f"e{i}"] = time.time()
            bus.publish(topic, events[i])

        paced(rate, count, send)
        deadline = time.monotonic() + 30
        while len(got := arrived()) < count + 1 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait()
        server.terminate()
        server.wait()
        bus.close()
    return [(got[i] - sent[i]) * 1000 for i in sent if i in got]


def throughput(count: int, processes: int = 1, *, kafka: str = KAFKA, partitions: int | None = None,
               bound: list[float] | None = None, rdkafka: list[float] | None = None) -> tuple[float, float]:
    """Events/s delivered by ``processes`` dispatcher processes sharing the trigger, and the raw consumer's,
    on a new topic of ``partitions`` (the bus's default if None) on the brokers ``kafka``; ``raw_delivery``'s
    rate on the same topic appended to ``bound`` and the raw librdkafka consumer's to ``rdkafka`` when given."""
    home = Path(tempfile.mkdtemp(prefix="cascade-disp-bench-"))
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    bus = open_bus(f"kafka://{kafka}")
    bus.ensure_topic(topic, partitions)
    for start in range(0, count, 1000):
        bus.publish_many(topic, [new_event("job.cancelled", {"jobId": f"j{i}"}, source="/bench", id=f"e{i}",
                                           partitionkey=f"k{i % 64}") for i in range(start, start + 1000)])
    raw = KafkaConsumer(topic, bootstrap_servers=kafka.split(","), group_id=f"raw-{topic}", auto_offset_reset="earliest",
                        enable_auto_commit=False)
    t0, got = time.perf_counter(), 0
    while got < count:
        got += sum(len(v) for v in raw.poll(500).values())
    raw_rate = count / (time.perf_counter() - t0)
    raw.close()
    if rdkafka is not None:
        rdkafka.append(raw_librdkafka(topic, count, kafka))
    server, port = serve("bench.noop_subscriber", {})  # answering before the dispatchers start
    if bound is not None:
        bound.append(raw_delivery(topic, count, f"http://127.0.0.1:{port}/", kafka))
    metrics = [free_port() for _ in range(processes)]
    procs = [dispatcher(home, f"kafka://{kafka}", REDIS, topic, f"http://127.0.0.1:{port}/", m, 64) for m in metrics]
    try:
        first = None
        while True:
            n = sum(delivered(m, f"{topic}-t") for m in metrics)
            if n and first is None:
                first = (time.perf_counter(), n)
            if n >= count:
                break
            time.sleep(0.05)
        assert first is not None
        rate = (count - first[1]) / (time.perf_counter() - first[0])
    finally:
        for proc in procs:
            proc.terminate()
        server.terminate()
        for proc in procs:
            proc.wait()
        bus.close()
    return rate, raw_rate


def _rdkafka_consumer(topic: str, group: str, kafka: str) -> confluent_kafka.Consumer:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": kafka, "group.id": group, "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    return consumer


def _take(consumer: confluent_kafka.Consumer, count: int) -> list[confluent_kafka.Message]:
    """Up to ``count`` records: the first waited for, the rest as far as already fetched (as the bus polls)."""
    first = consumer.poll(1.0)
    if first is None:
        return []
    return [m for m in [first, *consumer.consume(count - 1, 0)] if m.error() is None]


def raw_librdkafka(topic: str, count: int, kafka: str = KAFKA) -> float:
    """Events/s of the raw librdkafka consumer (the one the bus's group members use) reading ``count`` records."""
    consumer = _rdkafka_consumer(topic, f"raw-rd-{topic}", kafka)
    try:
        t0, got = time.perf_counter(), 0
        while got < count:
            got += len(_take(consumer, 500))
        return count / (time.perf_counter() - t0)
    finally:
        consumer.close()


def raw_delivery(topic: str, count: int, url: str, kafka: str = KAFKA, connections: int = 64) -> float:
    """Events/s of the least a Python dispatcher does: the raw librdkafka consumer's records (the dispatcher's
    consumer) POSTed as they come (Kafka's ``ce_*`` headers as HTTP ``ce-*`` headers) by the dispatcher's own client
    (``AsyncHTTP``) on its own loop (``new_loop``), ``connections`` in flight; no filter, claim, retry or commit. The
    bound of any dispatcher written on these two clients on this machine."""

    async def run() -> float:
        consumer = _rdkafka_consumer(topic, f"raw-post-{topic}", kafka)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[dict[str, str], bytes] | None] = asyncio.Queue(maxsize=4 * connections)
        client = AsyncHTTP(connections)

        async def post() -> None:
            while (item := await queue.get()) is not None:
                answer = await client.post(url, item[0], item[1], 30.0)
                assert answer.status == 200, answer.status

        posters = [asyncio.create_task(post()) for _ in range(connections)]
        t0, got = time.perf_counter(), 0
        try:
            while got < count:
                records = await loop.run_in_executor(None, _take, consumer, 500)
                for r in records:
                    headers = {k.replace("_", "-", 1): v.decode() for k, v in r.headers() or () if k.startswith("ce_")}
                    await queue.put(({**headers, "content-type": "application/json"}, r.value()))
                got += len(records)
            for _ in posters:
                await queue.put(None)
            await asyncio.gather(*posters)
            return count / (time.perf_counter() - t0)
        finally:
            await client.close()
            consumer.close()

    loop = new_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()


def subscriber_ceiling(seconds: int, connections: int = 64) -> float | None:
    """Requests/s the no-op subscriber answers when wrk (or hey) posts one binary-mode CloudEvent to it over as
    many connections as the dispatcher uses (None with neither: ``scripts/tools.sh bench`` builds hey)."""
    if shutil.which("wrk") is None and hey_path() is None:
        return None
    headers, body = ce_http.to_binary(new_event("job.cancelled", {"jobId": "j1"}, source="/bench", id="e1"))
    server, port = serve("bench.noop_subscriber", {})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return wrk(port, headers, body, seconds, connections, Path(tmp), path="/", status=200)
    finally:
        server.terminate()
        server.wait()


@contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes spinning on the CPU for the duration: other work on the machine, at the same priority."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--events", type=int, default=5000, help="events in the throughput run")
    args = parser.parse_args()
    count = int(args.rate * args.seconds)
    rows = []
    base = None
    for others in sorted({0, 1, os.cpu_count() or 1}):  # busy processes of someone else on the same cores
        for name, bus_url, state_url in (("kafka + redis", f"kafka://{KAFKA}", REDIS),
                                         ("embedded + sqlite", "embedded", "")):
            with busy(others):
                values = latency(bus_url, state_url or f"sqlite://{tempfile.mkdtemp()}/state.db", args.rate, count)
            base = base or percentile(values, 50)
            rows.append([name, others, len(values), percentile(values, 50), percentile(values, 99),
                         percentile(values, 50) / base])
    print(table(f"Publish -> subscriber start (ms) at {args.rate:.0f} events/s for {args.seconds:.0f}s, with 0, 1 "
                "and one per core busy processes of another user (ratio: p50 vs Kafka alone)",
                ["bus", "busy processes", "events", "p50", "p99", "p50 ratio"], rows))
    print()
    bound: list[float] = []
    rdkafka: list[float] = []
    rate, raw = throughput(args.events, bound=bound, rdkafka=rdkafka)
    ceiling = subscriber_ceiling(5)
    rows = [["raw kafka-python consumer", raw, 1.0, ceiling / raw if ceiling else "-"],
            ["raw librdkafka consumer (the bus's group members)", rdkafka[0], rdkafka[0] / raw,
             rdkafka[0] / ceiling if ceiling else "-"]]
    if ceiling:
        rows.append(["ceiling: wrk posting to the no-op subscriber, 64 connections", ceiling, ceiling / raw, 1.0])
    rows.append(["bound: the raw librdkafka consumer's records POSTed by the dispatcher's client, 64 in flight",
                 bound[0], bound[0] / raw, bound[0] / ceiling if ceiling else "-"])
    rows.append(["cascade dispatcher (HTTP delivery)", rate, rate / raw, rate / ceiling if ceiling else "-"])
    processes = os.cpu_count() or 1
    if processes > 1:  # several dispatcher processes sharing the trigger's consumer group
        shared, _ = throughput(args.events, processes)
        rows.append([f"{processes} dispatcher processes, one group", shared, shared / raw,
                     shared / ceiling if ceiling else "-"])
    print(table(f"Delivery throughput, {args.events} events, no-op HTTP subscriber (ratios: against the raw consumer "
                "and against the subscriber's ceiling)", ["reader", "events/s", "vs raw", "vs ceiling"], rows))


if __name__ == "__main__":
    main()
