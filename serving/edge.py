"""The edge agent: an edge cluster subscribes to model releases and deploys them itself.

One consumer group per cluster (``<topic>.edge.<cluster>``) on the broker topic. A
``model.released`` is taken when its target selector matches the cluster's labels
(``matchLabels`` and ``matchExpressions`` as in Kubernetes; no selector: every cluster).
Per model only the newest release in a batch is applied; an older or already applied one is
acknowledged and skipped, so an agent back from being offline catches up to the newest
version once. Rollout: fetch (sha256 verified), load behind the agent's own runtime at 0 %
traffic, smoke-test with the release's sample input, then take 100 %; any failure leaves the
previous version serving and reports ``model.deploy_failed``. Applied versions live in the
agent's own SQLite store, so a restart never re-applies.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from cloudevents.http import CloudEvent

from cascade.core.credentials import auth_header
from cascade.core.errors import CascadeError, InvalidEvent
from cascade.core.versions import version_key
from cascade.events.bus import EventBus
from cascade.events.envelope import event_type, follow_up, new_event
from cascade.serving import artifacts
from cascade.serving.artifacts import ArtifactPolicy
from cascade.serving.runtime.activator import Runtime
from cascade.stores.sqlite import SqliteStore

RELEASED = event_type("model.released")


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics; an empty selector selects everything."""
    if not selector:
        return True
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        present = key in labels
        if (op == "In" and (not present or labels[key] not in values)) or (op == "NotIn" and present and labels[key] in values) \
                or (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


class EdgeAgent:
    def __init__(self, cluster: str, labels: dict[str, str], bus: EventBus, topic: str, home: Path, runtime: Runtime,
                 runtime_url: str, policy: ArtifactPolicy, *, token: str = "", heartbeat: float = 10.0,
                 annotations: dict[str, str] | None = None) -> None:
        self.cluster, self.labels, self.bus, self.topic = cluster, labels, bus, topic
        self.annotations = annotations or {}  # autoscaling annotations of the model servers it deploys
        self.runtime, self.runtime_url, self.heartbeat_every = runtime, runtime_url, heartbeat
        self.store = SqliteStore(home / "edge-state.db")
        self.cache = home / "cache"
        self.policy, self.headers = policy, auth_header(token)  # where artifacts come from; the runtime's credential
        self._stop = threading.Event()

    def serving(self) -> dict[str, str]:
        return {r["model"]: r["version"] for r in self.store.find_records("edge-model")}

    def _emit(self, cause: CloudEvent | None, family: str, data: dict[str, Any]) -> None:
        source = f"/cascade/edge/{self.cluster}"
        event = (follow_up(cause, family, data, source=source, partitionkey=str(data.get("model", self.cluster)))
                 if cause is not None else new_event(family, data, source=source, partitionkey=self.cluster))
        self.bus.publish(self.topic, event)

    def heartbeat(self) -> None:
        self._emit(None, "edge.heartbeat", {"cluster": self.cluster, "labels": self.labels, "serving": self.serving(),
                                            "endpoint": self.runtime_url})

    def _deploy(self, model: str, version: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        assert self.runtime.loop is not None
        future = asyncio.run_coroutine_threadsafe(self.runtime.deploy_model(model, version, body), self.runtime.loop)
        return future.result(600)

    def apply(self, event: CloudEvent) -> None:
        d: dict[str, Any] = event.get_data() or {}
        model, version = str(d["model"]), str(d["version"])
        previous = self.serving().get(model)
        timings: dict[str, float] = {}
        started = time.monotonic()
        try:
            local = artifacts.fetch(str(d["artifactUri"]), str(d["sha256"]), self.cache, self.policy)
            timings["download"] = round(time.monotonic() - started, 3)
            status, answer = self._deploy(model, version, {"artifact": str(local), "format": d["format"],
                                                           "project": str(event.get("project") or "default"),
                                                           "signature": d.get("signature"),
                                                           "canaryTrafficPercent": 0 if previous else None,
                                                           "annotations": self.annotations})
            if status != 200:
                raise RuntimeError(f"{answer.get('message')}: {str(answer.get('log', ''))[-500:]}")
            timings["load"] = float(answer["loadSeconds"])
            if d.get("sampleInput") is not None:
                sample = d["sampleInput"]
                body = sample if isinstance(sample, dict) else {"instances": sample}
                reply = httpx.post(f"{self.runtime_url}/v2/models/{model}/versions/{version}/infer"
                                   if "inputs" in body else f"{self.runtime_url}/v1/models/{model}:predict",
                                   json=body, headers=self.headers, timeout=120)
                if reply.status_code != 200:
                    raise RuntimeError(f"smoke test answered {reply.status_code}: {reply.text[:300]}")
            self._deploy(model, version, {"artifact": str(local), "format": d["format"]})  # take all traffic
        except (CascadeError, RuntimeError, httpx.HTTPError) as exc:
            if previous:
                self._deploy(model, previous, {"artifact": "", "format": d["format"]})  # route back, already loaded
            data = {"model": model, "version": version, "target": "edge", "cluster": self.cluster, "reason": str(exc)}
            if previous:
                data["serving"] = previous
            self.store.put_record("edge-attempt", f"{model}:{version}", {"model": model, "version": version,
                                                                          "result": "failed"})
            self._emit(event, "model.deploy_failed", data)
            return
        timings["total"] = round(time.monotonic() - started, 3)
        self.store.put_record("edge-model", model, {"model": model, "version": version, "applied": time.time(),
                                                    "project": str(event.get("project") or "default"),
                                                    "artifact": str(local), "format": d["format"]})
        self.store.put_record("edge-attempt", f"{model}:{version}", {"model": model, "version": version,
                                                                      "result": "deployed"})
        self._emit(event, "model.deployed", {"model": model, "version": version, "target": "edge",
                                             "cluster": self.cluster, "endpoint": self.runtime_url,
                                             "timings": timings})

    def _wanted(self, event: CloudEvent) -> bool:
        d: dict[str, Any] = event.get_data() or {}
        if not selects(d.get("targets"), self.labels):
            return False
        if self.store.get_record("edge-attempt", f"{d['model']}:{d['version']}"):
            return False  # applied (or refused) before a restart: never again
        current = self.serving().get(str(d["model"]))
        return current is None or version_key(str(d["version"])) > version_key(current)

    def restore(self) -> None:
        """After a restart, serve again what this cluster served (from the checksum cache)."""
        for record in self.store.find_records("edge-model"):
            self._deploy(record["model"], record["version"], {"artifact": record["artifact"], "format": record["format"],
                                                              "project": record.get("project", "default")})

    def run(self) -> None:
        self.restore()
        consumer = self.bus.subscribe([self.topic], f"{self.topic}.edge.{self.cluster}", start="earliest")
        last_beat = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() - last_beat >= self.heartbeat_every:
                    self.heartbeat()
                    last_beat = time.monotonic()
                records = consumer.poll(0.5)
                newest: dict[str, CloudEvent] = {}
                for record in records:
                    try:
                        event = record.event()
                    except InvalidEvent:
                        continue
                    if event["type"] == RELEASED and self._wanted(event):
                        data: dict[str, Any] = event.get_data() or {}
                        held = newest.get(str(data["model"]))
                        if held is None or version_key(str(data["version"])) >= version_key(
                                str((held.get_data() or {})["version"])):
                            newest[str(data["model"])] = event  # older releases in the batch are superseded
                for event in newest.values():
                    self.apply(event)
                for record in records:
                    consumer.ack(record)
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop.set()


def fleet(records: list[CloudEvent]) -> dict[str, dict[str, Any]]:
    """The latest heartbeat per cluster."""
    out: dict[str, dict[str, Any]] = {}
    for event in records:
        data: dict[str, Any] = event.get_data() or {}
        out[data["cluster"]] = {**data, "time": event.get("time", "")}
    return out

