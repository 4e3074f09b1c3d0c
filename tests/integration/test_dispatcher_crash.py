"""Crash test: 10,000 events while the dispatcher process is SIGKILLed at random moments.

Afterwards every event reached the subscriber at least once, every side effect happened
exactly once, and nothing was dead-lettered. Prints lost / duplicate-invocation counts.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from cascade.events.envelope import new_event
from cascade.stores.idempotency import Claim, Idempotency
from cascade.stores.redis import RedisStore
from tests.conftest import KAFKA, REDIS, make_bus
from tests.helpers.subscriber import Answer, Delivery, Subscriber

pytestmark = pytest.mark.slow  # kills and restarts the dispatcher four times

EVENTS = 10_000
KILLS = 4
ROOT = Path(__file__).resolve().parents[2]


def test_sigkilled_dispatcher_loses_nothing_and_side_effects_happen_once(tmp_path: Path, topic: str) -> None:
    seed = int(os.environ.get("CASCADE_CRASH_SEED", time.time()))
    rng = random.Random(seed)
    print(f"\ncrash test seed {seed}")
    bus = make_bus("kafka", tmp_path)
    bus.ensure_topic(topic, 4)
    store = RedisStore(REDIS, namespace=f"crash-{topic}")
    effects = Idempotency(store, "effects")
    invocations: Counter[str] = Counter()
    applied: list[str] = []
    lock = threading.Lock()

    def handler(d: Delivery, n: int) -> Answer:
        with lock:
            invocations[d.id] += 1
        claim = effects.claim(d.headers["ce-source"], d.id)
        if claim is Claim.BUSY:
            return 503, {}, b"busy"
        if claim is Claim.ACQUIRED:
            with lock:
                applied.append(d.id)  # the side effect
            effects.complete(d.headers["ce-source"], d.id)
        return 200, {}, b""

    sub = Subscriber(behaviours={"/effects": handler})
    triggers = tmp_path / "crash.triggers.yaml"
    triggers.write_text(f"triggers:\n- name: {topic}-crash\n  subscriber: {sub.url('/effects')}\n  start: earliest\n"
                        "  concurrency: 32\n")
    env = {**os.environ, "CASCADE_HOME": str(tmp_path), "CASCADE_BUS__URL": f"kafka://{KAFKA}",
           "CASCADE_BUS__TOPIC": topic, "CASCADE_BUS__SESSION_TIMEOUT": "6", "CASCADE_STATE__URL": REDIS,
           "PYTHONPATH": str(ROOT)}

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "cascade.cli", "dispatcher", "--triggers", str(triggers),
                                 "--metrics-port", "0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    ids = [f"evt-{i}" for i in range(EVENTS)]

    def publish() -> None:
        for chunk in range(0, EVENTS, 500):
            bus.publish_many(topic, [new_event("job.cancelled", {"jobId": f"job-{i}"}, source="/crash", id=ids[i],
                                               partitionkey=f"job-{i % 97}") for i in range(chunk, chunk + 500)])
            time.sleep(0.2)

    publisher = threading.Thread(target=publish)
    publisher.start()
    proc = start()
    try:
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.5, 4.0))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc = start()
        publisher.join()
        deadline = time.monotonic() + 240
        while len(set(applied)) < EVENTS and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1.0)  # let stragglers show up as duplicates, if there were any
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        sub.close()
    lost = EVENTS - len(set(applied) & set(ids))
    duplicate_effects = len(applied) - len(set(applied))
    duplicate_invocations = sum(n - 1 for n in invocations.values() if n > 1)
    dead = sum(bus.end_offsets(f"cascade.dlq.{topic}-crash").values())
    missing = sorted(set(ids) - set(applied), key=lambda i: int(i.split("-")[1]))
    print(f"crash test: {EVENTS} events, {KILLS} SIGKILLs: lost={lost} duplicate_invocations={duplicate_invocations} "
          f"duplicate_side_effects={duplicate_effects} dead_lettered={dead} missing={missing[:20]}")
    bus.close()
    assert lost == 0
    assert duplicate_effects == 0
    assert dead == 0
