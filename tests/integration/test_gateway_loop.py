"""The gateway's event loop never waits on the state store.

Another process holding SQLite's write lock delays only the requests that must write (a job
submission); ``/healthz`` and reads keep answering at once, and the delayed request completes
when the lock is released.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import httpx

from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.core.settings import GatewaySettings
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.gateway import create_app
from cascade.events.identity import Projects
from cascade.stores.sqlite import SqliteStore

SPEC = {"kind": "training", "spec": {"framework": "pytorch", "entrypoint": {"script": "train.py"}}}


def test_a_locked_store_does_not_stall_the_loop(tmp_path: Path) -> None:
    store, bus = SqliteStore(tmp_path / "state.db"), EmbeddedBus(tmp_path / "bus.db")
    projects = Projects(store)
    projects.create_project("p")
    token = projects.create_token("p")
    server = ServerThread(create_app(bus, store, GatewaySettings(), "t"), port=free_port(), name="gateway").start()
    auth = {"authorization": f"Bearer {token}"}
    holder = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post("/v1/jobs", json=SPEC, headers=auth).status_code == 202  # warm: every path loaded
            holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
            answers: list[int] = []
            submit = threading.Thread(target=lambda: answers.append(
                client.post("/v1/jobs", json=SPEC, headers=auth).status_code))
            submit.start()
            # The submission waits on the lock for two seconds. A loop stalled behind the store could
            # answer at most one probe in that time (the one answered after the COMMIT); a free loop
            # answers many, whatever a busy two-core machine does to a single probe's latency.
            hold_until, answered, slowest = time.monotonic() + 2.0, 0, 0.0
            while time.monotonic() < hold_until:
                started = time.monotonic()
                assert client.get("/healthz").status_code == 200
                slowest = max(slowest, time.monotonic() - started)
                answered += 1
            assert answered >= 5, f"the loop stalled behind the store: {answered} probes, slowest {slowest:.2f} s"
            assert slowest < 1.5, f"the loop stalled behind the store for {slowest:.2f} s"
            assert answers == []
            holder.execute("COMMIT")  # ... and completes once the lock is free
            submit.join(30)
            assert answers == [202]
    finally:
        holder.close()
        server.stop()
        bus.close()
        store.close()
