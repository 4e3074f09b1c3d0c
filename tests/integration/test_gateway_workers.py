"""`cascade up --workers N`: gateway processes share the port, heal, and end with the platform."""

from __future__ import annotations

import os
import signal
import socket
import uuid
from pathlib import Path

import httpx
import redis

from cascade.events.bindings import http as ce_http
from cascade.events.bus import open_bus
from cascade.events.envelope import new_event
from tests.conftest import KAFKA
from tests.helpers.platform import Running, cascade_up
from tests.helpers.waiting import events_until, eventually

STATE = "redis://127.0.0.1:6379/4"  # a database of its own: the platform bootstraps its default project there


def workers(up: Running) -> set[int]:
    """Pids of the gateway worker processes whose parent is ``cascade up``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == up.proc.pid and b"cascade.app.gateway_workers" in cmdline:
            found.add(int(entry.name))
    return found


def gone(pid: int) -> bool:
    """Exited (a zombie that nobody reaped yet counts: a container's init may not reap orphans)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def post(up: Running, i: int) -> int:
    headers, body = ce_http.to_binary(new_event("dataset.uploaded", {"dataset": "cats", "uri": f"s3://cats/{i}.jpg",
                                                                     "size": i, "origin": "api"}, source="/workers",
                                                id=f"w{i}"))
    return httpx.post(f"{up.gateway}/events", headers={**headers, **up.auth}, content=body, timeout=60).status_code


def ready(up: Running) -> bool:
    """Whether a gateway process answers /readyz (bus and store reachable) within a few seconds."""
    try:
        return httpx.get(f"{up.gateway}/readyz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_workers_serve_while_the_parent_is_frozen_heal_and_stop_with_it(tmp_path: Path) -> None:
    # Kafka and Redis: a frozen parent holds no lock the worker needs (it might hold the embedded files' write lock)
    topic = f"workers-{uuid.uuid4().hex[:8]}"
    redis.Redis.from_url(STATE).flushdb()
    with cascade_up(tmp_path / "home", "--workers", "2", "--bus", f"kafka://{KAFKA}", "--state", STATE,
                    CASCADE_BUS__TOPIC=topic) as up:
        eventually(lambda: len(workers(up)) == 1, 90, "one worker process beside the parent")
        [first] = workers(up)
        os.kill(up.proc.pid, signal.SIGSTOP)  # the parent accepts nothing now: only the worker can answer
        try:
            # the worker process exists, but it may still be starting (importing, reaching the bus) on a loaded machine
            eventually(lambda: ready(up), 120, "the worker answering /readyz while the parent is frozen", interval=0.5)
            assert [post(up, i) for i in range(5)] == [202] * 5
        finally:
            os.kill(up.proc.pid, signal.SIGCONT)
        bus = open_bus(f"kafka://{KAFKA}")
        seen = events_until(bus, topic, lambda s: len(s) >= 5, 90, keep=lambda e: e["source"] == "/workers",
                            what="the worker's events on the platform's bus")
        assert sorted(e["id"] for e in seen) == [f"w{i}" for i in range(5)]
        bus.close()
        os.kill(first, signal.SIGKILL)
        eventually(lambda: len(workers(up) - {first}) == 1, 90, "the dead worker started again")
        assert post(up, 5) == 202
        alive = workers(up)
    assert alive and all(gone(pid) for pid in alive), "cascade up stopped: so did its workers"


def test_a_worker_ends_when_its_parent_is_killed_and_frees_the_port(tmp_path: Path) -> None:
    with cascade_up(tmp_path / "home", "--workers", "2") as up:
        eventually(lambda: len(workers(up)) == 1, 90, "one worker process beside the parent")
        [worker] = workers(up)
        port = int(up.gateway.rsplit(":", 1)[1])
        try:
            os.kill(up.proc.pid, signal.SIGKILL)  # no clean stop: the worker must notice on its own
            eventually(lambda: gone(worker), 30, "the orphaned worker exiting")

            def free() -> bool:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        s.bind(("127.0.0.1", port))
                    except OSError:
                        return False
                    return True
            eventually(free, 30, "the gateway's port free again")
        finally:
            try:
                os.killpg(up.proc.pid, signal.SIGKILL)  # the rest of the tree (instances, supervisors)
            except ProcessLookupError:
                pass
