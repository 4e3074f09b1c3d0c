"""Fixtures shared by every test: real buses and stores, each parametrised over backends.

Kafka, Redis and the Kubernetes control plane (``cluster``, tests/helpers/kube.py) are the
real servers started by ``scripts/services.sh``. When one is not answering, tests that need
it fail with the command to fix it; they never skip.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cascade.events.bus import Consumer, EventBus, Record
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.bus.kafka import KafkaBus
from cascade.stores import StateStore
from cascade.stores.redis import RedisStore
from cascade.stores.sqlite import SqliteStore

pytest_plugins = ["tests.helpers.kube"]  # the `cluster` fixture

KAFKA = "127.0.0.1:9092"
REDIS = "redis://127.0.0.1:6379/0"
FIX = "start it with: scripts/services.sh start"
KINDS = ("unit", "contract", "integration", "security", "faults", "e2e")
SLOW_KINDS = ("faults", "e2e")  # every test there starts the platform or kills a service

# Short timeouts so group changes and crashes show up within a test's patience.
BUS_OPTIONS: dict[str, dict[str, Any]] = {
    "embedded": {"session_timeout": 2.0, "commit_interval": 0.2},
    "kafka": {"session_timeout": 6.0, "commit_interval": 0.2},
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test is marked with its folder (unit, contract, integration, security, faults, e2e)."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        folder = parts[parts.index("tests") + 1] if "tests" in parts else ""
        if folder in KINDS:
            item.add_marker(folder)
            if folder in SLOW_KINDS:
                item.add_marker("slow")


def make_bus(kind: str, tmp_path: Path) -> EventBus:
    if kind == "embedded":
        return EmbeddedBus(tmp_path / "bus.db", **BUS_OPTIONS["embedded"])
    bus = KafkaBus(KAFKA, **BUS_OPTIONS["kafka"])
    try:
        bus.ping()
    except Exception as exc:  # the message says what to run
        pytest.fail(f"Kafka is not answering on {KAFKA} ({exc}); {FIX}", pytrace=False)
    return bus


def bus_url(kind: str, tmp_path: Path) -> str:
    return f"embedded://{tmp_path / 'bus.db'}" if kind == "embedded" else f"kafka://{KAFKA}"


@pytest.fixture(params=["embedded", "kafka"])
def bus_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def bus(bus_kind: str, tmp_path: Path) -> Iterator[EventBus]:
    b = make_bus(bus_kind, tmp_path)
    yield b
    b.close()


@pytest.fixture
def topic() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def group() -> str:
    return f"group-{uuid.uuid4().hex[:12]}"


def make_store(kind: str, tmp_path: Path) -> StateStore:
    if kind == "sqlite":
        return SqliteStore(tmp_path / "state.db")
    store = RedisStore(REDIS, namespace=f"test-{uuid.uuid4().hex[:12]}")
    try:
        store.ping()
    except Exception as exc:
        pytest.fail(f"Redis is not answering on {REDIS} ({exc}); {FIX}", pytrace=False)
    return store


@pytest.fixture(params=["sqlite", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(store_kind: str, tmp_path: Path) -> Iterator[StateStore]:
    s = make_store(store_kind, tmp_path)
    yield s
    s.close()


def drain(consumer: Consumer, count: int, timeout: float = 30.0, *, ack: bool = True) -> list[Record]:
    """Poll until ``count`` records arrived (or fail after ``timeout`` seconds)."""
    got: list[Record] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"only {len(got)} of {count} records arrived within {timeout}s")
        for record in consumer.poll(0.2):
            got.append(record)
            if ack:
                consumer.ack(record)
    return got


def polling(consumer: Consumer, stop: threading.Event) -> threading.Thread:
    """A started daemon thread that polls ``consumer`` (dropping what it gets) until ``stop`` is set, so that it
    takes part in its group's rebalances."""
    def run() -> None:
        while not stop.is_set():
            consumer.poll(0.1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_assigned(consumer: Consumer, timeout: float = 30.0) -> None:
    """Poll (receiving nothing) until the consumer owns partitions."""
    deadline = time.monotonic() + timeout
    while not consumer.assignment():
        if time.monotonic() > deadline:
            pytest.fail("consumer got no partitions")
        assert consumer.poll(0.1) == []
