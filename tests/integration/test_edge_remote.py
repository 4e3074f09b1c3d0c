"""Remote edge agents: separate processes that reach the platform only through an HTTPS gateway
behind a TCP proxy the test cuts and restores (no broker is reachable from them).

A release reaches the targeted clusters over the release feed; a cut link leaves them serving;
an agent restarted while cut serves its last good model again; on reconnect they catch up once,
skip what expired meanwhile and report the outage; a staged rollout stops at the wave whose
smoke test fails; the Kubernetes target applies an InferenceService on the real API server.
"""

from __future__ import annotations

import json
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.core.hashing import sha256_file
from cascade.core.ports import free_port
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.envelope import event_type, new_event
from cascade.serving import kserve
from cascade.stores.sqlite import SqliteStore
from tests.helpers import models
from tests.helpers.kube import KUBECONFIG, Cluster, Operator, unique
from tests.helpers.platform import Running, cascade_up
from tests.helpers.tcpproxy import TcpProxy
from tests.helpers.tls import self_signed
from tests.helpers.waiting import events_until, eventually

pytestmark = pytest.mark.slow  # the platform, agents and model servers start in every test

OUTCOMES = (event_type("model.deployed"), event_type("model.deploy_failed"))


class Edge:
    """The platform (HTTPS gateway), the proxy in front of it, and agents behind the proxy."""

    def __init__(self, tmp: Path, running: Running, cert: Path) -> None:
        self.tmp, self.running, self.cert = tmp, running, cert
        self.home = Path(running.env["CASCADE_HOME"])
        self.proxy = TcpProxy(int(running.gateway.rsplit(":", 1)[1]))
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.creds: dict[str, Path] = {}
        self.bus = EmbeddedBus(self.home / "bus.db")
        self.model = f"edge{uuid.uuid4().hex[:6]}"
        self.infer = {"authorization": f"Bearer {running.token}"}  # the agents check tokens in the shared store

    def register(self, cluster: str, labels: str) -> None:
        out = self.running.cascade("edge", "register", cluster, "--label", labels)
        assert out.returncode == 0, out.stderr
        self.creds[cluster] = self.tmp / f"{cluster}.credential"
        self.creds[cluster].write_text(out.stdout.strip())
        self.creds[cluster].chmod(0o600)

    def start(self, cluster: str, *extra: str, env: dict[str, str] | None = None) -> None:
        self.ports.setdefault(cluster, free_port())
        full = {**self.running.env, "CASCADE_SERVING__SCALE_TO_ZERO_GRACE_SECONDS": "600", **(env or {})}
        full.pop("CASCADE_BUS__URL", None)
        self.procs[cluster] = subprocess.Popen(
            [sys.executable, "-m", "cascade.cli", "edge", "agent", "--cluster", cluster,
             "--gateway", f"https://127.0.0.1:{self.proxy.port}", "--ca-file", str(self.cert),
             "--credential-file", str(self.creds[cluster]), "--port", str(self.ports[cluster]), "--heartbeat", "1",
             *extra], env=full, stderr=subprocess.DEVNULL)

    def kill(self, cluster: str) -> None:
        self.procs[cluster].send_signal(signal.SIGKILL)
        self.procs[cluster].wait()

    def release(self, version: str, artifact: Path, model: str = "", **extra: Any) -> float:
        event = new_event("model.released", {
            "model": model or self.model, "version": version, "artifactUri": artifact.as_uri(),
            "sha256": sha256_file(artifact), "format": "torchscript", "targets": {"matchLabels": {"region": "eu"}},
            "sampleInput": [[1.0, 1.0, 1.0, 1.0]], **extra}, source="/tests", partitionkey=model or self.model,
            extensions={"project": "default"})
        self.bus.publish(self.running.env.get("CASCADE_BUS__TOPIC", "cascade.events"), event)
        return time.monotonic()

    def outcomes(self, wait_for: dict[tuple[str, str, str], int], timeout: float = 180) -> list[Any]:
        """Outcomes on the bus so far, waiting until each (type, cluster, version) was seen as often as asked."""
        def done(seen: list[Any]) -> bool:
            count = {k: sum(1 for e in seen if (e["type"].split(".")[3], e.get_data()["cluster"],
                                                e.get_data()["version"]) == k) for k in wait_for}
            return all(count[k] >= n for k, n in wait_for.items())

        return events_until(self.bus, self.running.env.get("CASCADE_BUS__TOPIC", "cascade.events"), done, timeout,
                            what=str(wait_for), keep=lambda e: e["type"] in OUTCOMES)

    def version(self, cluster: str, model: str = "") -> str:
        try:
            reply = httpx.post(f"http://127.0.0.1:{self.ports[cluster]}/v2/models/{model or self.model}/infer",
                               timeout=60, headers=self.infer, json={
                                   "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                                               "data": [1.0, 1.0, 1.0, 1.0]}]})
        except httpx.ConnectError:
            return "not listening"
        return str(reply.json().get("model_version")) if reply.status_code == 200 else str(reply.status_code)

    def status(self, cluster: str) -> dict[str, Any]:
        return SqliteStore(self.home / "state.db").get_record("edge-status", cluster) or {}

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        self.proxy.close()
        self.bus.close()


@pytest.fixture
def edge(tmp_path: Path) -> Iterator[Edge]:
    cert, key = self_signed(tmp_path / "tls")
    with cascade_up(tmp_path / "home", CASCADE_GATEWAY__TLS_CERT_FILE=str(cert), CASCADE_GATEWAY__TLS_KEY_FILE=str(key),
                    CASCADE_SECURITY__ARTIFACT_ROOTS=json.dumps([str(tmp_path)]),
                    wait_for=("gateway", "runtime")) as running:
        e = Edge(tmp_path, running, cert)
        yield e
        e.close()


def test_remote_agents_follow_releases_through_a_cut_and_a_restart(edge: Edge, tmp_path: Path) -> None:
    for cluster, labels in (("eu-1", "region=eu"), ("eu-2", "region=eu"), ("us-1", "region=us")):
        edge.register(cluster, labels)
        edge.start(cluster)
    published = edge.release("1", models.torchscript(tmp_path, bias=1.0))
    seen = edge.outcomes({("deployed", "eu-1", "1"): 1, ("deployed", "eu-2", "1"): 1})
    for e in seen:
        data = e.get_data()
        print(f"\nrelease-to-serving over HTTPS, {data['cluster']}: {time.monotonic() - published:.2f}s after "
              f"publish (timings {data['timings']})")
        assert data["timings"]["bytes"] == (tmp_path / "model-1.0.torchscript.pt").stat().st_size
    assert edge.version("eu-1") == "1" and edge.version("eu-2") == "1"
    assert edge.version("us-1") == "404", "us-1 is not targeted"
    eventually(lambda: edge.status("eu-1").get("position", 0) >= 1, 30, "eu-1 reported its feed position")

    downstream = edge.proxy.downstream
    edge.proxy.cut()
    edge.release("2", models.torchscript(tmp_path, bias=2.0))
    soon = (datetime.now(timezone.utc) + timedelta(seconds=1)).isoformat()
    edge.release("1", models.torchscript(tmp_path, bias=5.0), model=f"{edge.model}-short", notAfter=soon)
    edge.kill("eu-2")  # restarted while cut off: it serves its last good model again, from its own cache
    edge.start("eu-2")
    eventually(lambda: edge.version("eu-2") == "1", 120, "eu-2 serves version 1 again without a connection")
    assert edge.version("eu-1") == "1", "eu-1 keeps serving while cut off"
    eventually(lambda: datetime.now(timezone.utc) > datetime.fromisoformat(soon), 5, "the short release expired")

    edge.proxy.restore()
    back = time.monotonic()
    seen = edge.outcomes({("deployed", "eu-1", "2"): 1, ("deployed", "eu-2", "2"): 1,
                          ("deploy_failed", "eu-1", "1"): 1, ("deploy_failed", "eu-2", "1"): 1})
    print(f"\nreconnect-to-caught-up: {time.monotonic() - back:.2f}s; bytes from the gateway for release 2 and the "
          f"expired one, both clusters: {edge.proxy.downstream - downstream}")
    skipped = [e.get_data() for e in seen if e["type"] == OUTCOMES[1]]
    assert all("expired" in d["reason"] for d in skipped) and len(skipped) == 2, skipped
    assert edge.version("eu-1") == "2" and edge.version("eu-2") == "2"
    eventually(lambda: (edge.status("eu-2").get("offline") or {}).get("restarts") == 1, 30,
               "eu-2 reported its outage, with the restart in it")
    assert edge.status("eu-2")["offline"]["serving"] == {edge.model: "1"}
    listing = edge.running.cascade("edge", "ls")
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if "eu-1" in line)
    assert f"{edge.model}:2" in row and "https" in row, listing.stdout


def test_the_edge_endpoints_refuse_what_a_cluster_may_not_do(edge: Edge, tmp_path: Path) -> None:
    edge.register("eu-1", "region=eu")
    edge.register("us-1", "region=us")
    artifact = models.torchscript(tmp_path, bias=1.0)
    edge.release("1", artifact)
    gw, verify = edge.running.gateway, ssl.create_default_context(cafile=edge.cert)

    def auth(cluster: str) -> dict[str, str]:
        return {"authorization": f"Bearer {edge.creds[cluster].read_text().strip()}"}

    sha = sha256_file(artifact)
    url = f"{gw}/edge/v1/artifacts/{sha}"
    eventually(lambda: httpx.get(url, headers=auth("eu-1"), verify=verify).status_code == 200, 60,
               "the release is on the feed")
    size = artifact.stat().st_size
    part = httpx.get(url, headers={**auth("eu-1"), "range": "bytes=10-"}, verify=verify)
    assert part.status_code == 206 and part.headers["content-range"] == f"bytes 10-{size - 1}/{size}"
    assert part.content == artifact.read_bytes()[10:]
    assert httpx.get(url, headers={**auth("eu-1"), "range": f"bytes={size}-"}, verify=verify).status_code == 416
    assert httpx.get(url, headers=auth("us-1"), verify=verify).status_code == 404, "us-1 sees no eu release"
    assert httpx.get(url, verify=verify).status_code == 401
    assert httpx.get(url, headers=edge.infer, verify=verify).status_code == 403, "a project token is not a cluster's"
    assert httpx.get(f"{gw}/edge/v1/releases", headers=edge.running.admin, verify=verify).status_code == 403

    with httpx.stream("GET", f"{gw}/edge/v1/releases", headers=auth("us-1"), verify=verify, timeout=10) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")

    def report(sender: str, **data: Any) -> httpx.Response:
        event = new_event("model.deployed", {"model": edge.model, "version": "1", "target": "edge", **data},
                          source="/x")
        return httpx.post(f"{gw}/edge/v1/events", headers={**auth(sender), "content-type":
                          "application/cloudevents+json"}, verify=verify,
                          content=json.dumps({**event.get_attributes(), "data": event.get_data()}))
    assert report("eu-1", cluster="us-1").status_code == 403, "a cluster speaks only for itself"
    assert report("us-1", cluster="us-1").status_code == 403, "us-1 never got this release"
    assert report("eu-1", cluster="eu-1").status_code == 202

    assert edge.running.cascade("edge", "revoke", "eu-1").returncode == 0
    eventually(lambda: httpx.get(url, headers=auth("eu-1"), verify=verify).status_code == 401, 30,
               "a revoked credential is refused")
    with pytest.raises(httpx.HTTPError):  # the port speaks only TLS
        httpx.get(url.replace("https", "http"), headers=auth("us-1"))

    with httpx.stream("GET", f"{gw}/edge/v1/releases", headers=auth("us-1"), verify=verify, timeout=60) as r:
        assert r.status_code == 200  # a stream that never ends by itself does not hold up a stop
        stopping = time.monotonic()
        edge.running.proc.send_signal(signal.SIGTERM)
        assert edge.running.proc.wait(timeout=60) == 0
        assert time.monotonic() - stopping < 20, f"the platform took {time.monotonic() - stopping:.1f}s to stop"


def test_a_staged_rollout_stops_at_the_wave_whose_smoke_test_fails(edge: Edge, tmp_path: Path) -> None:
    clusters = ["eu-a", "eu-b", "eu-c", "eu-d", "eu-e"]
    bad = tmp_path / "eu-c-smoke.json"
    bad.write_text(json.dumps([[1.0, 1.0]]))  # this site's own check: its inputs have two features
    for cluster in clusters:
        edge.register(cluster, "region=eu")
        edge.start(cluster, *(["--smoke-input", str(bad)] if cluster == "eu-c" else []))
    edge.release("1", models.torchscript(tmp_path, bias=1.0), rollout={"waves": [["eu-a"], ["eu-b", "eu-c"]]})
    seen = edge.outcomes({("deployed", "eu-a", "1"): 1, ("deployed", "eu-b", "1"): 1,
                          ("deploy_failed", "eu-c", "1"): 1})
    failed = next(e.get_data() for e in seen if e["type"] == OUTCOMES[1])
    assert "smoke test" in failed["reason"], failed
    store = SqliteStore(edge.home / "state.db")
    eventually(lambda: (store.get_record("edge-rollout", f"{edge.model}:1") or {}).get("status") == "halted", 30,
               "the rollout halted")
    rollout = store.get_record("edge-rollout", f"{edge.model}:1") or {}
    assert rollout["waves"] == [["eu-a"], ["eu-b", "eu-c"], ["eu-d", "eu-e"]] and rollout["wave"] == 1
    assert "eu-c" in rollout["reason"]
    audiences = [e["clusters"] for e in store.find_records("edge-feed") if e["event"]["data"]["model"] == edge.model]
    assert audiences == [["eu-a"], ["eu-b", "eu-c"]], "the third wave never opened"
    assert [edge.version(c) for c in clusters] == ["1", "1", "404", "404", "404"]
    listing = edge.running.cascade("edge", "ls")
    assert "halted" in listing.stdout and "2/3" in listing.stdout, listing.stdout


@pytest.mark.parametrize("target", ["kserve", "deployment"])
def test_an_agent_deploys_into_its_own_kubernetes_cluster(edge: Edge, cluster: Cluster, tmp_path: Path,
                                                         target: str) -> None:
    prefix = unique("edge") + "-"
    namespace = cluster.namespace(f"{prefix}default")
    where = ("serving.kserve.io", "v1beta1", "inferenceservices") if target == "kserve" else ("apps", "v1", "deployments")
    ready = ({"conditions": [{"type": "Ready", "status": "True"}]} if target == "kserve" else
             {"replicas": 1, "availableReplicas": 1, "readyReplicas": 1, "updatedReplicas": 1})
    operator = Operator(cluster, *where, namespace, lambda obj: ready)
    try:
        edge.register("k3s-1", "region=eu")
        edge.start("k3s-1", "--target", target,
                   env={"KUBECONFIG": str(KUBECONFIG), "CASCADE_TRAINING__NAMESPACE_PREFIX": prefix})
        artifact = models.torchscript(tmp_path, bias=1.0)
        edge.release("1", artifact)
        seen = edge.outcomes({("deployed", "k3s-1", "1"): 1}, timeout=120)
        assert seen[0].get_data()["timings"]["ready"] >= 0
        if target == "kserve":
            isvc = cluster.custom.get_namespaced_custom_object(*where[:2], namespace, where[2], edge.model)
            assert kserve.storage_uri(isvc) == artifact.as_uri(), isvc
        else:
            pod = cluster.custom.get_namespaced_custom_object(*where[:2], namespace, where[2],
                                                              f"{edge.model}-v1")["spec"]["template"]["spec"]
            assert pod["initContainers"][0]["args"] == [artifact.as_uri(), "/mnt/models"]
            service = cluster.core.read_namespaced_service(edge.model, namespace)
            assert service.spec.selector == {"cascade.io/model": edge.model, "cascade.io/serves": "yes"}
    finally:
        operator.stop()
