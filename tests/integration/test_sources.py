"""Sources on the real Kafka bus: the watched folder and S3 notifications arriving on Kafka."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from cascade.events.bus import EventBus
from cascade.events.sources.folder import FolderSource
from cascade.events.sources.s3_kafka import S3KafkaSource
from cascade.stores.redis import RedisStore
from cascade.stores.sqlite import SqliteStore
from tests.conftest import drain, make_bus, make_store
from tests.helpers.waiting import eventually, holds


def published(bus: EventBus, topic: str) -> int:
    return sum(bus.end_offsets(topic).values())


def test_folder_announces_each_completed_file_once_and_survives_restarts(tmp_path: Path, topic: str) -> None:
    bus, store = make_bus("kafka", tmp_path), SqliteStore(tmp_path / "state.db")
    root = tmp_path / "incoming"
    (root / "cats").mkdir(parents=True)
    (root / "cats" / "a.jpg").write_bytes(b"a" * 100)
    (root / "cats" / ".hidden").write_bytes(b"x")
    (root / "cats" / "b.jpg.part").write_bytes(b"x")
    source = FolderSource(root, bus, store, topic=topic, project="alpha", settle=0.3)
    assert source.scan() == [], "a file must settle first"
    announced: list[Any] = []
    eventually(lambda: bool(announced.extend(source.scan()) or announced), 5, "the settled file announced")
    [first] = announced
    assert first.get_data() == {"dataset": "cats", "uri": (root / "cats" / "a.jpg").as_uri(), "key": "cats/a.jpg",
                                "size": 100, "sha256": hashlib.sha256(b"a" * 100).hexdigest(), "origin": "folder"}
    assert first["project"] == "alpha" and first["partitionkey"] == "cats"
    holds(lambda: source.scan() == [], 0.5, "announced once")

    # A growing file is announced only when it stops changing, and then once.
    watcher = FolderSource(root, bus, store, topic=topic, project="alpha", settle=0.5)
    thread = threading.Thread(target=watcher.run)
    thread.start()
    try:
        with (root / "cats" / "c.jpg").open("wb") as f:
            for _ in range(5):
                f.write(b"c" * 1000)
                f.flush()
                time.sleep(0.2)
        (root / "top.csv").write_text("x,y\n1,2\n")
        eventually(lambda: published(bus, topic) >= 3, 15, "three files announced")
        holds(lambda: published(bus, topic) == 3, 1.0, "each file announced once")
    finally:
        watcher.stop()
        thread.join()
    assert published(bus, topic) == 3

    # Down: one file changes, one arrives, one is only touched. Restart announces two.
    (root / "cats" / "a.jpg").write_bytes(b"A" * 100)
    (root / "cats" / "d.jpg").write_bytes(b"d")
    (root / "top.csv").touch()
    restarted = FolderSource(root, bus, store, topic=topic, project="alpha", settle=0.0)
    assert sorted(e.get_data()["key"] for e in restarted.scan()) == ["cats/a.jpg", "cats/d.jpg"]
    consumer = bus.subscribe([topic], "check", start="earliest")
    events = [r.event() for r in drain(consumer, 5)]
    consumer.close()
    sizes = {e.get_data()["key"]: e.get_data()["size"] for e in events if e.get_data()["key"] == "cats/c.jpg"}
    assert sizes == {"cats/c.jpg": 5000}, "the growing file was announced complete, once"
    assert {e.get_data()["dataset"] for e in events} == {"cats", "incoming"}
    bus.close()


def test_s3_notifications_on_kafka(tmp_path: Path, topic: str) -> None:
    bus = make_bus("kafka", tmp_path)
    store = make_store("redis", tmp_path)
    assert isinstance(store, RedisStore)
    notifications = f"{topic}-minio"
    record = {"EventName": "s3:ObjectCreated:Put", "Key": "cats/a%20b.jpg",
              "Records": [{"eventSource": "minio:s3", "eventName": "s3:ObjectCreated:Put",
                           "s3": {"bucket": {"name": "cats"},
                                  "object": {"key": "a%20b.jpg", "size": 5, "sequencer": "1"}}}]}
    from cascade.events.bindings.kafka import WireRecord

    bus.append(notifications, [WireRecord(b"cats/a.jpg", (), json.dumps(record).encode()),
                               WireRecord(None, (), b"not json"),
                               WireRecord(b"cats/a.jpg", (), json.dumps(record).encode())])  # MinIO retried
    source = S3KafkaSource(bus, store, notifications=notifications, topic=topic, project="alpha",
                          dead_letters=f"{topic}-dlq")
    thread = threading.Thread(target=source.run)
    thread.start()
    try:
        eventually(lambda: bus.committed(notifications, "cascade-s3-source") == bus.end_offsets(notifications), 30,
                   "every notification record handled and acknowledged")
    finally:
        source.stop()
        thread.join()
    consumer = bus.subscribe([topic], "check", start="earliest")
    [event] = [r.event() for r in drain(consumer, 1)]
    consumer.close()
    assert published(bus, topic) == 1, "the retried notification was not published again"
    assert event.get_data()["key"] == "a b.jpg" and event.get_data()["origin"] == "minio"
    dead = bus.subscribe([f"{topic}-dlq"], "check", start="earliest")
    [letter] = drain(dead, 1, timeout=30)
    dead.close()
    assert letter.value == b"not json" and dict(letter.headers)["cascade-reason"].startswith(b"not JSON")
    bus.close()


def test_folder_waits_for_a_writer_that_pauses_and_ignores_folders_linked_from_outside(tmp_path: Path) -> None:
    from cascade.events.bus.embedded import EmbeddedBus

    root, outside = tmp_path / "inbox", tmp_path / "elsewhere"
    (root / "cats").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.csv").write_text("not yours")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    bus, store = EmbeddedBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "state.db")
    source = FolderSource(root, bus, store, settle=0.2)
    with (root / "cats" / "slow.csv").open("w") as writer:
        writer.write("x,y\n")
        writer.flush()
        holds(lambda: source.scan() == [], 1.0, "a file still open for writing is not announced, however long it pauses")
        writer.write("1,2\n")
    announced: list[Any] = []
    eventually(lambda: bool(announced.extend(source.scan()) or announced), 5, "announced once closed")
    assert [(e.get_data()["key"], e.get_data()["size"]) for e in announced] == [("cats/slow.csv", 8)]
    holds(lambda: source.scan() == [], 0.5, "and nothing from the linked folder")
    bus.close()
