"""The EventBus contract, written once and run against the embedded log and real Kafka."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest

from cascade.core.errors import InvalidEvent
from cascade.events.bindings.kafka import WireRecord
from cascade.events.bus import EventBus, Record
from cascade.events.envelope import new_event
from tests.conftest import BUS_OPTIONS, bus_url, drain, make_bus, polling, wait_assigned
from tests.helpers.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def cancelled(job: str, n: int = 0) -> object:
    return new_event("job.cancelled", {"jobId": job, "reason": str(n)}, source="/tests", partitionkey=job)


class TestBusContract:
    def test_round_trip_keeps_attributes_data_and_key(self, bus: EventBus, topic: str, group: str) -> None:
        event = new_event("dataset.uploaded", {"dataset": "d1", "uri": "s3://b/k", "size": 7, "origin": "minio"},
                          source="/tests", partitionkey="d1", extensions={"traceparent": "00-abc-def-01"})
        position = bus.publish(topic, event)
        consumer = bus.subscribe([topic], group, start="earliest")
        [record] = drain(consumer, 1)
        consumer.close()
        assert (record.topic, record.partition, record.offset) == (position.topic, position.partition, position.offset)
        assert record.key == b"d1"
        got = record.event()
        assert got.get_attributes() == event.get_attributes()
        assert got.get_data() == event.get_data()

    def test_order_is_kept_per_key(self, bus: EventBus, topic: str, group: str) -> None:
        events = [cancelled(f"job-{i % 5}", i) for i in range(60)]
        positions = bus.publish_many(topic, events)
        by_key: dict[str, set[int]] = defaultdict(set)
        for event, pos in zip(events, positions):
            by_key[event["partitionkey"]].add(pos.partition)
        assert all(len(parts) == 1 for parts in by_key.values()), "one key, one partition"
        consumer = bus.subscribe([topic], group, start="earliest")
        records = drain(consumer, 60)
        consumer.close()
        seen: dict[str, list[int]] = defaultdict(list)
        for record in records:
            e = record.event()
            seen[e["partitionkey"]].append(int(e.get_data()["reason"]))
        assert {k: v for k, v in seen.items()} == {f"job-{k}": list(range(k, 60, 5)) for k in range(5)}

    def test_group_members_share_partitions(self, bus: EventBus, topic: str, group: str) -> None:
        bus.ensure_topic(topic, 4)
        first = bus.subscribe([topic], group, start="earliest")
        second = bus.subscribe([topic], group, start="earliest")
        received: dict[str, list[Record]] = {"first": [], "second": []}
        stop = threading.Event()

        def run(name: str, consumer: object) -> None:
            while not stop.is_set():
                for r in consumer.poll(0.1):  # type: ignore[attr-defined]
                    consumer.ack(r)  # type: ignore[attr-defined]
                    received[name].append(r)

        threads = [threading.Thread(target=run, args=(n, c)) for n, c in (("first", first), ("second", second))]
        for t in threads:
            t.start()
        try:
            def split() -> bool:  # both own some, together all, none twice (a snapshot taken mid-rebalance may not)
                a, b = first.assignment(), second.assignment()
                return bool(a and b) and len(a | b) == 4 and not a & b

            eventually(split, 30, "the group splitting its partitions between its members")
            sent = 0
            while not (received["first"] and received["second"]):  # a member dropped under load rejoins: send more
                assert sent < 1000, f"one member got all {sent} events: {len(received['first'])} and " \
                                    f"{len(received['second'])}"
                bus.publish_many(topic, [cancelled(f"job-{sent + i}", sent + i) for i in range(200)])
                sent += 200
                eventually(lambda: len(received["first"]) + len(received["second"]) >= sent, 60,
                           f"all {sent} events delivered (none missing)")
                if not (received["first"] and received["second"]):  # one member owned them all: let it back in
                    eventually(split, 60, "the dropped member rejoining and the group splitting again")
        finally:
            stop.set()
            for t in threads:
                t.join()
            first.close()
            second.close()
        offsets = [(r.partition, r.offset) for r in received["first"] + received["second"]]
        assert len(offsets) == len(set(offsets)) == sent, "each event went to exactly one member"

    def test_each_member_gets_a_share_of_every_topic(self, bus: EventBus, topic: str, group: str) -> None:
        """A trigger reads its topic and its retry topic: a split that balanced only the count of partitions could
        leave one member all of the events and the other all of the (empty) retries."""
        retry = f"{topic}.retry"
        for name in (topic, retry):
            bus.ensure_topic(name, 4)
        members = [bus.subscribe([topic, retry], group, start="earliest")]
        stop = threading.Event()
        threads = [polling(members[0], stop)]
        try:  # the second joins a member that owns everything, as a second dispatcher process does
            eventually(lambda: len(members[0].assignment()) == 8, 60, "the first member owning every partition")
            members.append(bus.subscribe([topic, retry], group, start="earliest"))
            threads.append(polling(members[1], stop))

            def split() -> bool:
                owned = [m.assignment() for m in members]
                return len(owned[0] | owned[1]) == 8 and not owned[0] & owned[1] and all(
                    {name for name, _ in mine} == {topic, retry} for mine in owned)

            eventually(split, 60, "each member owning partitions of both topics")
        finally:
            stop.set()
            for t in threads:
                t.join()
            for m in members:
                m.close()

    def test_a_partition_that_comes_straight_back_resumes_after_what_was_handed_out(
        self, bus: EventBus, topic: str, group: str
    ) -> None:
        """Records in flight when a member joins stay with the member that has them, if their partition stays too:
        it neither gets them again nor commits past them before they are acknowledged."""
        bus.ensure_topic(topic, 4)
        bus.publish_many(topic, [cancelled(f"job-{i}", i) for i in range(40)])
        first = bus.subscribe([topic], group, start="earliest")
        held = drain(first, 40, ack=False)
        second = bus.subscribe([topic], group, start="earliest")
        again: list[Record] = []
        stop = threading.Event()
        thread = polling(second, stop)
        try:
            def split() -> bool:
                again.extend(first.poll(0.1))
                mine, theirs = first.assignment(), second.assignment()
                return bool(mine and theirs) and not mine & theirs and len(mine | theirs) == 4

            eventually(split, 60, "the partitions split between the two members")
            kept = first.assignment()
            again.extend(first.poll(0.5))
        finally:
            stop.set()
            thread.join()
        twice = [(r.partition, r.offset) for r in again if r.tp in kept]
        assert not twice, f"handed out again on a partition that stayed: {twice}"
        for record in held:
            first.ack(record)
        first.commit()
        ends = bus.end_offsets(topic)
        committed = bus.committed(topic, group)
        first.close()
        second.close()
        assert {p: committed.get(p) for _, p in kept} == {p: ends[p] for _, p in kept}

    def test_uncommitted_events_are_redelivered_after_a_consumer_dies(
        self, bus: EventBus, bus_kind: str, tmp_path: Path, topic: str, group: str
    ) -> None:
        bus.ensure_topic(topic, 1)
        bus.publish_many(topic, [cancelled("job-x", i) for i in range(20)])
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.crashing_consumer", bus_url(bus_kind, tmp_path), topic, group,
             "20", "8", json.dumps(BUS_OPTIONS[bus_kind])],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            assert proc.stdout is not None
            lines = [proc.stdout.readline().strip() for _ in range(2)]
            assert lines == ["READY", "GOT 20"], lines
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert bus.committed(topic, group) == {0: 8}
        survivor = bus.subscribe([topic], group, start="earliest")
        records = drain(survivor, 12, timeout=60)
        assert survivor.poll(1.0) == [], "nothing beyond the unacknowledged events"
        survivor.close()
        assert [int(r.event().get_data()["reason"]) for r in records] == list(range(8, 20))

    def test_nothing_is_lost_across_a_restart(self, bus_kind: str, tmp_path: Path, topic: str, group: str) -> None:
        first = make_bus(bus_kind, tmp_path)
        first.publish_many(topic, [cancelled(f"job-{i}", i) for i in range(50)])
        first.close()
        second = make_bus(bus_kind, tmp_path)
        consumer = second.subscribe([topic], group, start="earliest")
        records = drain(consumer, 50)
        consumer.close()
        second.close()
        assert sorted(int(r.event().get_data()["reason"]) for r in records) == list(range(50))

    def test_only_the_contiguous_acknowledged_prefix_is_committed(self, bus: EventBus, topic: str, group: str) -> None:
        bus.ensure_topic(topic, 1)
        bus.publish_many(topic, [cancelled("job-a", i) for i in range(5)])
        consumer = bus.subscribe([topic], group, start="earliest")
        records = drain(consumer, 5, ack=False)
        for i in (0, 1, 3, 4):
            consumer.ack(records[i])
        consumer.commit()
        assert bus.committed(topic, group) == {0: 2}, "offset 2 is unfinished, so nothing past it"
        consumer.ack(records[2])
        consumer.commit()
        assert bus.committed(topic, group) == {0: 5}
        consumer.close()

    def test_a_new_group_at_latest_commits_its_start_and_resumes_there(
        self, bus: EventBus, topic: str, group: str
    ) -> None:
        bus.ensure_topic(topic, 2)
        bus.publish_many(topic, [cancelled(f"old-{i}", i) for i in range(6)])
        consumer = bus.subscribe([topic], group, start="latest")
        wait_assigned(consumer)
        consumer.close()
        assert bus.committed(topic, group) == bus.end_offsets(topic)
        bus.publish_many(topic, [cancelled(f"new-{i}", 100 + i) for i in range(3)])
        recreated = bus.subscribe([topic], group, start="latest")
        records = drain(recreated, 3)
        recreated.close()
        assert sorted(int(r.event().get_data()["reason"]) for r in records) == [100, 101, 102]

    def test_a_seeded_group_starts_where_it_was_seeded_not_where_it_joins(
        self, bus: EventBus, topic: str, group: str
    ) -> None:
        bus.ensure_topic(topic, 2)
        bus.publish_many(topic, [cancelled(f"old-{i}", i) for i in range(4)])
        bus.seed_group(topic, group)
        assert bus.committed(topic, group) == bus.end_offsets(topic)
        bus.publish_many(topic, [cancelled(f"between-{i}", 100 + i) for i in range(3)])  # before anyone joined
        bus.seed_group(topic, group)  # seeding again moves nothing
        consumer = bus.subscribe([topic], group, start="latest")
        records = drain(consumer, 3)
        consumer.close()
        assert sorted(int(r.event().get_data()["reason"]) for r in records) == [100, 101, 102]

    def test_a_record_that_is_not_a_cloudevent_is_delivered_and_fails_to_decode(
        self, bus: EventBus, topic: str, group: str
    ) -> None:
        bus.append(topic, [WireRecord(b"k", (("content-type", b"text/plain"),), b"\xff not an event")])
        consumer = bus.subscribe([topic], group, start="earliest")
        [record] = drain(consumer, 1)
        consumer.close()
        with pytest.raises(InvalidEvent):
            record.event()
        with pytest.raises(ValueError):  # typed errors are ValueErrors too
            record.event()
