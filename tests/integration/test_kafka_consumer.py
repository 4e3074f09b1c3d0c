"""The Kafka bus's group members on librdkafka: what its API would otherwise get wrong for a dispatcher.

librdkafka's ``consume`` waits its whole timeout unless the batch fills, its ``assignment`` can wait while another
thread polls through a rebalance, and its commits may be sent without waiting. Each test below fails on the naive
use of that API.
"""

from __future__ import annotations

import threading
import time

from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus.kafka import KafkaBus
from tests.conftest import KAFKA, drain, polling, wait_assigned
from tests.helpers.waiting import eventually


def test_a_poll_returns_when_a_record_comes_not_at_its_timeout(topic: str, group: str) -> None:
    bus = KafkaBus(KAFKA)
    consumer = bus.subscribe([topic], group, start="latest")
    try:
        wait_assigned(consumer)
        threading.Timer(0.3, bus.append, (topic, [WireRecord(b"k", (), b"{}")])).start()
        began = time.monotonic()
        records = consumer.poll(10.0, max_records=200)
        took = time.monotonic() - began
        assert len(records) == 1 and took < 3.0, f"{len(records)} records after {took:.1f}s of a 10s poll"
    finally:
        consumer.close()
        bus.close()


def test_assignment_answers_at_once_while_members_poll_through_rebalances(topic: str, group: str) -> None:
    """This thread only reads what the asking thread saw, and closes on a thread of its own: a consumer whose
    ``assignment`` hangs fails the test instead of hanging it."""
    bus = KafkaBus(KAFKA)
    bus.ensure_topic(topic, 4)
    members = [bus.subscribe([topic], group, start="earliest")]
    seen: dict[int, int] = {}  # member -> partitions it owned when last asked
    stop = threading.Event()
    slowest = [0.0]

    def ask() -> None:
        while not stop.is_set():
            for i, member in enumerate(list(members)):
                began = time.monotonic()
                seen[i] = len(member.assignment())
                slowest[0] = max(slowest[0], time.monotonic() - began)
            stop.wait(0.005)  # pacing the questions; ends at once when the test stops

    threads = [polling(members[0], stop), threading.Thread(target=ask, daemon=True)]
    try:
        threads[1].start()
        eventually(lambda: seen.get(0) == 4, 30, "the first member owning all partitions")
        members.append(bus.subscribe([topic], group, start="earliest"))  # a rebalance while both are asked
        threads.append(polling(members[1], stop))
        eventually(lambda: seen.get(0) == seen.get(1) == 2, 30, "the partitions shared between the two members")
    finally:
        stop.set()
        closing = threading.Thread(target=lambda: [m.close() for m in members], daemon=True)
        closing.start()
        for t in [*threads, closing]:
            t.join(30)
    assert not any(t.is_alive() for t in [*threads, closing]), "a thread stuck in the consumer"
    bus.close()
    assert slowest[0] < 1.0, f"assignment() took {slowest[0]:.2f}s"


def test_polling_commits_the_acknowledged_prefix_without_a_commit_call(topic: str, group: str) -> None:
    bus = KafkaBus(KAFKA, commit_interval=0.2)
    bus.ensure_topic(topic, 1)
    bus.append(topic, [WireRecord(b"k", (), b"{}") for _ in range(5)])
    consumer = bus.subscribe([topic], group, start="earliest")
    try:
        for record in drain(consumer, 5, ack=False)[:3]:
            consumer.ack(record)

        def committed() -> bool:
            consumer.poll(0.1)  # the commit is sent by a poll, and its answer served by a later one
            return bus.committed(topic, group) == {0: 3}

        eventually(committed, 30, "offset 3 (three acknowledged) committed by polling alone")
    finally:
        consumer.close()
        bus.close()
