"""Fault injection: the tests' own Kafka and Redis processes, and a workload that measures loss.

Each fault test starts its own services on their own ports (so killing them never disturbs
another test), runs ``cascade up`` on them with two triggers on ``dataset.uploaded`` (an
idempotent user function whose side effect is a line in a file, and a plain HTTP
subscriber), posts events one by one to ``POST /events``, injects the fault, and reports:
sent, accepted (202), delivered, lost, duplicate deliveries, duplicate side effects, dead
letters, and the seconds from the fault's end until the gateway accepted again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx

from cascade.core.ports import free_port
from cascade.events.bus import open_bus
from tests.helpers.platform import Running, cascade_up
from tests.helpers.subscriber import Subscriber
from tests.helpers.waiting import eventually, until

ROOT = Path(__file__).resolve().parents[2]


def kafka_cluster() -> ModuleType:
    """``scripts/kafka_cluster.py``, the one definition of a local KRaft node, shared with services.sh."""
    spec = importlib.util.spec_from_file_location("kafka_cluster", ROOT / "scripts" / "kafka_cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port_pair(count: int = 6) -> int:
    """A base port with ``count`` free ports from it (a Kafka node takes port and port + 1)."""
    import random
    import socket

    for _ in range(100):
        base = random.randrange(20000, 30000, 2)  # below the kernel's ephemeral range
        try:
            for port in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free port range")


@contextmanager
def own_services(root: Path, brokers: int = 1) -> Iterator[tuple[Any, RedisServer]]:
    """This test module's own Kafka (``brokers`` KRaft nodes) and Redis, on ports nobody else uses."""
    kafka = kafka_cluster().Cluster(root / "kafka", brokers, free_port_pair(2 * max(brokers, 3)))
    kafka.start()
    redis = RedisServer(root / "redis")
    redis.start()
    try:
        yield kafka, redis
    finally:
        kafka.stop()
        redis.kill()


class RedisServer:
    """Debian's redis-server with an append-only file fsynced on every write, so kill -9 loses nothing."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        folder.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        redis = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.proc = subprocess.Popen([redis, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.folder),
                                      "--appendonly", "yes", "--appendfsync", "always", "--save", ""],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        eventually(lambda: self._answers(), 20, "redis answering")

    def _answers(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


HANDLER = '''"""A side effect per handled event: one line in a file (O_APPEND, so lines never interleave)."""
import os
import time

def handle(event):
    time.sleep(float(os.environ.get("SINK_DELAY", "0")))  # work in progress when a fault hits
    fd = os.open(os.environ["SINK_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (event["id"] + "\\n").encode())
    finally:
        os.close(fd)
'''


@dataclass
class Report:
    sent: int = 0
    accepted: list[str] = field(default_factory=list)
    refused: int = 0
    recovered_after: float | None = None

    def line(self, delivered: set[str], deliveries: list[str], effects: list[str], dead: int) -> str:
        lost = len(set(self.accepted) - delivered)
        return (f"sent={self.sent} accepted={len(self.accepted)} refused={self.refused} delivered={len(delivered)} "
                f"lost={lost} duplicate_deliveries={len(deliveries) - len(set(deliveries))} "
                f"duplicate_side_effects={len(effects) - len(set(effects))} dead_letters={dead} "
                f"recovered_after_s={'-' if self.recovered_after is None else f'{self.recovered_after:.1f}'}")


class Workload:
    """``cascade up`` on the given bus and store, two triggers, and a sender at ``rate`` events/s."""

    def __init__(self, tmp_path: Path, bus_url: str, state_url: str, *, rate: float = 50.0, retry: int = 3,
                 handler_delay: float = 0.05) -> None:
        self.tmp_path, self.bus_url, self.state_url, self.rate = tmp_path, bus_url, state_url, rate
        self.topic = f"faults-{uuid.uuid4().hex[:8]}"
        self.sink = tmp_path / "side-effects.txt"
        self.sub = Subscriber()
        self.report = Report()
        self._stop = threading.Event()
        self._sender: threading.Thread | None = None
        self.fault_ended: float | None = None
        self.running: Running | None = None
        fn = tmp_path / "fns" / "sink"
        fn.mkdir(parents=True)
        (fn / "handler.py").write_text(HANDLER)
        (fn / "func.yaml").write_text(json.dumps({
            "name": "sink", "module": "handler", "idempotent": True,
            "env": {"SINK_FILE": str(self.sink), "SINK_DELAY": str(handler_delay)},
            "triggers": [{"name": "sink", "filters": [{"exact": {"type": "io.cascade.dataset.uploaded.v1"}}],
                          "delivery": {"retry": retry, "backoffDelay": "PT0.5S", "timeout": "PT10S"}}]}))
        self.triggers = tmp_path / "hook.triggers.yaml"
        self.triggers.write_text(json.dumps({"triggers": [{
            "name": "hook", "subscriber": self.sub.url("/hook"),
            "filters": [{"exact": {"type": "io.cascade.dataset.uploaded.v1"}}],
            "delivery": {"retry": retry, "backoffDelay": "PT0.5S", "timeout": "PT10S"}}]}))

    @contextmanager
    def platform(self, home: Path | None = None, wait_for: tuple[str, ...] = ("gateway", "runtime")) -> Iterator[Running]:
        """``cascade up``, used as soon as ``wait_for`` answer (the gateway's /readyz: a user sends at once)."""
        with cascade_up(home or self.tmp_path / "home", "--bus", self.bus_url, "--state", self.state_url,
                        wait_for=wait_for,
                        CASCADE_BUS__TOPIC=self.topic, CASCADE_FUNCTIONS__PATHS=json.dumps([str(self.tmp_path / "fns")]),
                        CASCADE_DISPATCHER__TRIGGERS=json.dumps([str(self.triggers)]),
                        CASCADE_SOURCES__FOLDER_ENABLED="false") as running:
            self.running = running
            yield running

    def _send(self, gateway: str, token: str) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                event_id = f"{self.topic}-{self.report.sent:06d}"  # CloudEvents ids are unique per source
                self.report.sent += 1
                event = {"specversion": "1.0", "id": event_id, "source": "/faults", "datacontenttype": "application/json",
                         "type": "io.cascade.dataset.uploaded.v1",
                         "data": {"dataset": "d", "uri": f"file:///d/{event_id}", "size": 1, "origin": "api"}}
                try:
                    code = client.post(f"{gateway}/events", json=event, headers={
                        "authorization": f"Bearer {token}", "content-type": "application/cloudevents+json"}).status_code
                except httpx.HTTPError:
                    code = 0
                if code == 202:
                    self.report.accepted.append(event_id)
                    if self.fault_ended is not None and self.report.recovered_after is None:
                        self.report.recovered_after = time.monotonic() - self.fault_ended
                else:
                    self.report.refused += 1
                self._stop.wait(1.0 / self.rate)

    def start_sending(self) -> None:
        assert self.running is not None
        self._stop.clear()
        self._sender = threading.Thread(target=self._send, args=(self.running.gateway, self.running.token), daemon=True)
        self._sender.start()

    def stop_sending(self) -> None:
        self._stop.set()
        if self._sender is not None:
            self._sender.join(60)

    def wait_accepted(self, count: int, timeout: float = 60) -> None:
        eventually(lambda: len(self.report.accepted) >= count, timeout, f"{count} events accepted")

    def effects(self) -> list[str]:
        return self.sink.read_text().split() if self.sink.exists() else []

    def hook_ids(self) -> list[str]:
        return [d.id for d in self.sub.at("/hook")]

    def dead_letters(self) -> int:
        bus = open_bus(self.bus_url)
        try:
            return sum(sum(bus.end_offsets(f"cascade.dlq.{name}").values()) for name in ("sink", "hook"))
        finally:
            bus.close()

    def settle(self, timeout: float = 180) -> str:
        """Wait until every accepted event reached both triggers (or ``timeout``); the report line."""
        accepted = set(self.report.accepted)
        until(lambda: accepted <= set(self.effects()) and accepted <= set(self.hook_ids()), timeout, 0.2)
        effects, hooks = self.effects(), self.hook_ids()
        sink = self.report.line(set(effects), effects, effects, self.dead_letters())
        hook = self.report.line(set(hooks), hooks, effects, 0)
        return f"function: {sink}\nhttp subscriber: {hook}"

    def lost(self) -> tuple[set[str], set[str]]:
        accepted = set(self.report.accepted)
        return accepted - set(self.effects()), accepted - set(self.hook_ids())


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found through /proc), whatever their session."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL a process and every process below it at once (templates, instances, model servers), as a
    machine that loses power would: nobody gets to drain or give anything back."""
    victims = [proc.pid, *descendants(proc.pid)]
    for pid in victims:
        try:
            os.kill(pid, signal.SIGSTOP)  # freeze first, so none reacts to another's death
        except ProcessLookupError:
            pass
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(30)
