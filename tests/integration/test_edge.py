"""Edge agents in separate processes on the real Kafka bus: targeting, refusing corrupt
artifacts while the old version answers, and catching up once after being offline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.core.hashing import sha256_file
from cascade.core.ports import free_port
from cascade.events.bus.kafka import KafkaBus
from cascade.events.envelope import event_type, new_event
from cascade.events.identity import Projects
from cascade.stores.sqlite import SqliteStore
from tests.conftest import KAFKA, make_bus
from tests.helpers import models
from tests.helpers.waiting import events_until

pytestmark = pytest.mark.slow  # the platform or model servers start in every test

MODEL = f"edge{uuid.uuid4().hex[:6]}"


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.topic = tmp, f"edge-{uuid.uuid4().hex[:8]}"
        bus = make_bus("kafka", tmp)
        assert isinstance(bus, KafkaBus)
        self.bus = bus
        self.bus.ensure_topic(self.topic)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.labels = {"eu-1": "region=eu", "us-1": "region=us", "eu-2": "region=eu,hw=ascend"}
        projects = Projects(SqliteStore(tmp / "home" / "state.db"))  # the agents' store: their runtimes check tokens there
        projects.create_project("default")
        self.auth = {"authorization": f"Bearer {projects.create_token('default', scopes=['infer'])}"}

    def start(self, cluster: str) -> None:
        self.ports.setdefault(cluster, free_port())
        env = {**os.environ, "CASCADE_HOME": str(self.tmp / "home"), "CASCADE_BUS__URL": f"kafka://{KAFKA}",
               "CASCADE_BUS__TOPIC": self.topic, "CASCADE_BUS__SESSION_TIMEOUT": "6",
               "CASCADE_SERVING__SCALE_TO_ZERO_GRACE_SECONDS": "600",
               "CASCADE_SECURITY__ARTIFACT_ROOTS": json.dumps([str(self.tmp)])}  # where the test's models are
        self.procs[cluster] = subprocess.Popen(
            [sys.executable, "-m", "cascade.cli", "edge", "agent", "--cluster", cluster, "--label", self.labels[cluster],
             "--port", str(self.ports[cluster]), "--heartbeat", "1"], env=env, stderr=subprocess.DEVNULL)

    def kill(self, cluster: str) -> None:
        self.procs[cluster].send_signal(signal.SIGKILL)
        self.procs[cluster].wait()

    def release(self, version: str, artifact: Path, sha: str | None = None) -> float:
        event = new_event("model.released", {"model": MODEL, "version": version, "artifactUri": artifact.as_uri(),
                                             "sha256": sha or sha256_file(artifact), "format": "torchscript",
                                             "targets": {"matchLabels": {"region": "eu"}},
                                             "sampleInput": [[1.0, 1.0, 1.0, 1.0]]},
                          source="/tests", partitionkey=MODEL)
        self.bus.publish(self.topic, event)
        return time.time()

    def outcomes(self, wait_for: dict[tuple[str, str, str], int], timeout: float = 180) -> list[Any]:
        """Deploy outcomes so far, waiting until each (type, cluster, version) was seen as often as asked."""
        def done(seen: list[Any]) -> bool:
            count = {k: sum(1 for e in seen if (e["type"].split(".")[3], e.get_data()["cluster"],
                                                e.get_data()["version"]) == k) for k in wait_for}
            return all(count[k] >= n for k, n in wait_for.items())

        return events_until(self.bus, self.topic, done, timeout, what=str(wait_for),
                            keep=lambda e: e["type"] in (event_type("model.deployed"), event_type("model.deploy_failed")))

    def version(self, cluster: str) -> str:
        reply = httpx.post(f"http://127.0.0.1:{self.ports[cluster]}/v2/models/{MODEL}/infer", timeout=60,
                           headers=self.auth, json={
            "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 1.0, 1.0, 1.0]}]})
        return str(reply.json().get("model_version")) if reply.status_code == 200 else str(reply.status_code)

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        self.bus.close()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    yield f
    f.close()


def test_releases_reach_the_right_clusters_refuse_corruption_and_catch_up_once(fleet: Fleet, tmp_path: Path) -> None:
    for cluster in fleet.labels:
        fleet.start(cluster)
    published = fleet.release("1", models.torchscript(tmp_path, bias=1.0))
    seen = fleet.outcomes({("deployed", "eu-1", "1"): 1, ("deployed", "eu-2", "1"): 1})
    first = next(e for e in seen if e.get_data()["cluster"] == "eu-1")
    print(f"\nrelease-to-serving on an edge agent: {time.time() - published:.2f}s after publish "
          f"(timings {first.get_data()['timings']})")
    assert fleet.version("eu-1") == "1" and fleet.version("eu-2") == "1"
    assert fleet.version("us-1") == "404", "us-1 is not targeted"

    artifact = models.torchscript(tmp_path, bias=2.0)
    fleet.release("2", artifact, sha="0" * 64)  # a corrupted artifact: the checksum does not match
    seen = fleet.outcomes({("deploy_failed", "eu-1", "2"): 1, ("deploy_failed", "eu-2", "2"): 1})
    failed = next(e.get_data() for e in seen if e["type"].endswith("deploy_failed.v1") and e.get_data()["cluster"] == "eu-1")
    assert "sha256" in failed["reason"] and failed["serving"] == "1"
    assert fleet.version("eu-1") == "1", "the old version still answers"

    fleet.kill("eu-2")
    fleet.release("3", models.torchscript(tmp_path, bias=3.0))
    fleet.release("4", models.torchscript(tmp_path, bias=4.0))
    fleet.outcomes({("deployed", "eu-1", "4"): 1})
    fleet.start("eu-2")
    seen = fleet.outcomes({("deployed", "eu-2", "4"): 1})
    time.sleep(3)
    fleet.kill("eu-2")  # and once more: a restart never re-applies
    fleet.start("eu-2")
    time.sleep(8)
    seen = fleet.outcomes({("deployed", "eu-2", "4"): 1})
    eu2 = [(e["type"].split(".")[3], e.get_data()["version"]) for e in seen if e.get_data()["cluster"] == "eu-2"]
    assert eu2 == [("deployed", "1"), ("deploy_failed", "2"), ("deployed", "4")], eu2
    assert fleet.version("eu-2") == "4" and fleet.version("eu-1") == "4"
    assert not [e for e in seen if e.get_data()["cluster"] == "us-1"]
    env = {**os.environ, "CASCADE_HOME": str(fleet.tmp / "home"), "CASCADE_BUS__URL": f"kafka://{KAFKA}",
           "CASCADE_BUS__TOPIC": fleet.topic}
    listing = subprocess.run([sys.executable, "-m", "cascade.cli", "edge", "ls"], env=env, capture_output=True,
                             text=True, timeout=120)
    rows = {line.split()[1]: line for line in listing.stdout.splitlines() if "-1 " in line or "eu-2" in line}
    assert set(rows) >= {"eu-1", "eu-2", "us-1"} and "kafka" in rows["us-1"], listing.stdout
    assert f"{MODEL}:4" in rows["eu-2"], listing.stdout
