"""The embedded defaults under a full disk or a read-only file: 503, never 202 or 500, and back to
202 once space (or write access) returns. Nothing answered 202 is missing from the log.

A full disk is SQLite's ``max_page_count`` reached and a read-only file is ``query_only``: the
errors SQLite raises then (SQLITE_FULL, SQLITE_READONLY) are the ones a real full disk or
read-only mount raises, without needing a mount this sandbox cannot make.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.core.settings import GatewaySettings
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.gateway import create_app
from cascade.events.identity import Projects
from cascade.stores.sqlite import SqliteStore
from tests.conftest import drain

JOB = {"kind": "training", "spec": {"framework": "pytorch", "entrypoint": {"script": "train.py"}}}


def event(i: int) -> dict[str, object]:
    return {"specversion": "1.0", "id": f"e-{i}", "source": "/faults", "type": "io.cascade.dataset.uploaded.v1",
            "datacontenttype": "application/json",
            "data": {"dataset": "d", "uri": f"file:///d/{i}/" + "x" * 2000, "size": 1, "origin": "api"}}


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[httpx.Client, EmbeddedBus, SqliteStore]]:
    bus, store = EmbeddedBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "state.db")
    projects = Projects(store)
    projects.create_project("p")
    token = projects.create_token("p")
    server = ServerThread(create_app(bus, store, GatewaySettings(rate_per_second=1e6, burst=10**6), "t"),
                          port=free_port(), name="gateway").start()
    with httpx.Client(base_url=server.url, timeout=30, headers={"authorization": f"Bearer {token}"}) as client:
        yield client, bus, store
    server.stop()
    bus.close()
    store.close()


def post(client: httpx.Client, i: int) -> int:
    return client.post("/events", json=event(i), headers={"content-type": "application/cloudevents+json"}).status_code


def test_a_full_disk_refuses_with_503_and_heals(gateway: tuple[httpx.Client, EmbeddedBus, SqliteStore]) -> None:
    client, bus, _ = gateway
    assert post(client, 0) == 202
    (pages,) = bus._conn.execute("PRAGMA page_count").fetchone()
    bus._conn.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full
    codes = [post(client, i) for i in range(1, 200)]
    assert 503 in codes and 500 not in codes and set(codes) <= {202, 503}, codes
    accepted = 1 + codes.count(202)
    bus._conn.execute("PRAGMA max_page_count = 1073741823")  # space is back
    assert post(client, 1000) == 202
    print(f"\nfull disk: {accepted} accepted before it filled, {codes.count(503)} refused with 503, then 202 again")
    consumer = bus.subscribe(["t"], "check", start="earliest")
    assert len(drain(consumer, accepted + 1)) == accepted + 1, "every 202 is in the log"
    consumer.close()


def test_a_read_only_bus_or_store_refuses_with_503_and_heals(
        gateway: tuple[httpx.Client, EmbeddedBus, SqliteStore]) -> None:
    client, bus, store = gateway
    bus._conn.execute("PRAGMA query_only = 1")
    assert post(client, 1) == 503
    bus._conn.execute("PRAGMA query_only = 0")
    assert post(client, 2) == 202
    store._conn.execute("PRAGMA query_only = 1")
    refused = client.post("/v1/jobs", json=JOB)
    assert refused.status_code == 503 and refused.headers["retry-after"], refused.text
    store._conn.execute("PRAGMA query_only = 0")
    assert client.post("/v1/jobs", json=JOB).status_code == 202
