"""The embedded bus rings its consumers' doorbells across processes, so they need not poll."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from cascade.events.bus import embedded_consumer
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.bus.wakeup import SUPPORTED, Doorbell, Ringer
from cascade.events.envelope import new_event

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="abstract unix sockets are Linux's")

PUBLISH = """
import sys
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.envelope import new_event
bus = EmbeddedBus(sys.argv[1])
bus.publish("t", new_event("job.cancelled", {"jobId": "j1"}, source="/other-process"))
bus.close()
"""


def test_a_doorbell_rings_when_rung_and_stays_silent_otherwise(tmp_path: Path) -> None:
    bell = Doorbell(str(tmp_path / "bus.db"), "m1")
    other = Doorbell(str(tmp_path / "other.db"), "m1")  # same member id, another bus: another doorbell
    ringer = Ringer(str(tmp_path / "bus.db"))
    assert bell.wait(0.05) is False
    ringer.ring(["m1", "gone"])  # a member without a doorbell is skipped
    assert bell.wait(5) is True
    assert bell.wait(0.05) is False, "each ring is taken once"
    assert other.wait(0.05) is False
    for bellish in (bell, other):
        bellish.close()
    ringer.ring(["m1"])  # nobody listens any more: no error
    ringer.close()


def test_a_publish_in_another_process_wakes_a_waiting_consumer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    monkeypatch.setattr(embedded_consumer, "RECHECK", 30.0)  # a missed ring would cost the consumer a second
    path = str(tmp_path / "bus.db")
    bus = EmbeddedBus(path)
    bus.ensure_topic("t")
    consumer = bus.subscribe(["t"], "g", start="earliest")
    assert consumer.poll(0.05) == []
    doorbell = consumer._doorbell  # type: ignore[attr-defined]
    assert doorbell is not None
    subprocess.run([sys.executable, "-c", PUBLISH, path], check=True, timeout=60)
    assert doorbell.wait(10) is True, "the other process rang this consumer"
    records = consumer.poll(10)
    assert [r.event()["source"] for r in records] == ["/other-process"]
    # Caught up, the next poll waits for the doorbell before it looks; a record committed meanwhile has rung it.
    subprocess.run([sys.executable, "-c", PUBLISH, path], check=True, timeout=60)
    started = time.monotonic()
    assert [r.event()["source"] for r in consumer.poll(10)] == ["/other-process"]
    assert time.monotonic() - started < 0.5, "the caught-up consumer waited out its recheck instead of the ring"
    bus.publish("t", new_event("job.cancelled", {"jobId": "j2"}, source="/this-process"))
    assert doorbell.wait(10) is True, "a publish in this process rings it too"
    consumer.close()
    bus.close()
