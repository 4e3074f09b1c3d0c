"""The edge agent: an edge cluster takes model releases and deploys them itself.

Releases reach it one of two ways: inside the data centre as a consumer group per cluster
(``<topic>.edge.<cluster>``) on the broker topic, filtered by the release's label selector; or,
from behind NAT, over HTTPS from the gateway's release feed (:class:`RemoteLink`, with the
cluster's credential; ``Last-Event-ID`` is the agent's position, so a reconnect after hours
resumes exactly there). Per model only the newest release of a batch is applied, so an agent
back from being offline catches up to the newest version once; a release whose ``notAfter``
passed before it arrived is skipped with the reason.

Rollout through a :class:`DeployTarget`: the agent's own runtime (fetch with sha256, load at
0 % traffic, smoke-test with the release's sample input, then take 100 %) or the edge
cluster's Kubernetes (an InferenceService; KServe's readiness is the gate). Any failure leaves
the previous version serving and reports ``model.deploy_failed``. What it applied lives in the
agent's own SQLite store, so a restart never re-applies and serves the last good model again
without a connection; remote outcomes wait in an outbox there until the link is back.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
from cloudevents.conversion import to_dict
from cloudevents.http import CloudEvent

from cascade.core.credentials import auth_header
from cascade.core.errors import CascadeError, InvalidEvent, Unauthorized
from cascade.core.versions import version_key
from cascade.events.bindings import http as ce_http
from cascade.events.bus import EventBus
from cascade.events.edge import selects
from cascade.events.envelope import event_type, follow_up, new_event
from cascade.serving import artifacts
from cascade.serving.artifacts import ArtifactPolicy
from cascade.serving.targets.base import DeployFailed, DeployTarget, Release
from cascade.stores.sqlite import SqliteStore

__all__ = ["EdgeAgent", "RemoteLink", "fleet"]

log = logging.getLogger(__name__)
RELEASED = event_type("model.released")


@dataclass
class RemoteLink:
    """The agent's HTTPS channel to the gateway: the release stream, outcomes back, artifacts."""

    gateway: str
    credential: str
    verify: ssl.SSLContext | bool = True  # trusts the CA that signed the gateway's certificate
    rate: float = 0.0  # bytes/s for artifact downloads; 0: no limit
    read_timeout: float = 15.0  # the gateway comments every 5 s; silence this long is a dead link

    @property
    def headers(self) -> dict[str, str]:
        return auth_header(self.credential)

    def stream(self, position: int) -> Iterator[list[tuple[int, CloudEvent]]]:
        """Batches of (feed number, release) from after ``position``; an empty batch at each keep-alive."""
        timeout = httpx.Timeout(10.0, read=self.read_timeout)
        with httpx.Client(verify=self.verify, timeout=timeout) as client, client.stream(
                "GET", f"{self.gateway}/edge/v1/releases",
                headers={**self.headers, "last-event-id": str(position), "accept": "text/event-stream"}) as reply:
            if reply.status_code in (401, 403):
                raise Unauthorized(f"the gateway refused this cluster's credential ({reply.status_code}); "
                                   "register the cluster again: cascade edge register")
            if reply.status_code != 200:
                raise httpx.HTTPStatusError(f"release stream answered {reply.status_code}", request=reply.request,
                                            response=reply)
            batch: list[tuple[int, CloudEvent]] = []
            seq, data = 0, ""
            yield []  # connected
            for line in reply.iter_lines():
                if line.startswith(":"):
                    if batch or "keepalive" in line:
                        yield batch
                        batch = []
                elif line.startswith("id:"):
                    seq = int(line[3:].strip())
                elif line.startswith("data:"):
                    data += line[5:].strip()
                elif not line and data:
                    try:
                        batch.append((seq, ce_http.parse({"content-type": ce_http.STRUCTURED}, data.encode())[0]))
                    except InvalidEvent as exc:  # not a release this agent can read: pass over it, say so
                        log.warning("release feed entry %d is not a CloudEvent (%s); skipped", seq, exc)
                    data = ""

    def send(self, events: list[CloudEvent]) -> None:
        headers, body = ce_http.to_batch(events)
        reply = httpx.post(f"{self.gateway}/edge/v1/events", content=body, headers={**headers, **self.headers},
                           verify=self.verify, timeout=30)
        if reply.status_code in (401, 403):
            raise Unauthorized(f"the gateway refused this cluster's report: {reply.text[:300]}")
        reply.raise_for_status()

    def artifact_url(self, sha256: str) -> str:
        return f"{self.gateway}/edge/v1/artifacts/{sha256}"


def _expired(data: Mapping[str, Any]) -> str | None:
    """The release's ``notAfter`` when it has passed."""
    not_after = data.get("notAfter")
    if not not_after:
        return None
    when = datetime.fromisoformat(str(not_after).replace("Z", "+00:00"))
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return str(not_after) if when <= datetime.now(timezone.utc) else None


class EdgeAgent:
    def __init__(self, cluster: str, labels: dict[str, str], home: Path, target: DeployTarget, policy: ArtifactPolicy,
                 *, bus: EventBus | None = None, topic: str = "", link: RemoteLink | None = None,
                 runtime_url: str = "", token: str = "", heartbeat: float = 10.0, smoke: Any = None) -> None:
        self.cluster, self.labels, self.bus, self.topic, self.link = cluster, labels, bus, topic, link
        self.target, self.runtime_url, self.heartbeat_every = target, runtime_url, heartbeat
        self.smoke = smoke  # this site's own smoke-test input, checked instead of the release's sample
        self.store = SqliteStore(home / "edge-state.db")
        self.cache = home / "cache"
        self.policy, self.headers = policy, auth_header(token)  # where artifacts come from; the runtime's credential
        self._stop = threading.Event()
        self._send_lock = threading.Lock()
        self.online = threading.Event()

    # -- what it serves and where it stands ----------------------------------------------------
    def serving(self) -> dict[str, str]:
        return {r["model"]: r["version"] for r in self.store.find_records("edge-model")}

    def position(self) -> int:
        record = self.store.get_record("edge-link", "position")
        return int(record["seq"]) if record else 0

    # -- reports: onto the bus, or through the outbox to the gateway ---------------------------
    def _emit(self, cause: CloudEvent | None, family: str, data: dict[str, Any]) -> bool:
        """Publish a report (on the bus, or through the outbox to the gateway); False while it waits there."""
        source = f"/cascade/edge/{self.cluster}"
        event = (follow_up(cause, family, data, source=source, partitionkey=str(data.get("model", self.cluster)))
                 if cause is not None else new_event(family, data, source=source, partitionkey=self.cluster))
        if self.link is None:
            assert self.bus is not None
            self.bus.publish(self.topic, event)
            return True
        if family == "edge.heartbeat":
            return self.flush(event)
        key = f"{time.time_ns():020d}-{event['id']}"
        self.store.put_record("edge-outbox", key, {"key": key, "event": to_dict(event)})
        return self.flush()

    def flush(self, beat: CloudEvent | None = None) -> bool:
        """Send what waits in the outbox, oldest first (and ``beat``); False while the gateway cannot be reached."""
        assert self.link is not None
        with self._send_lock:
            waiting = self.store.find_records("edge-outbox")
            events = [ce_http.parse({"content-type": ce_http.STRUCTURED}, json.dumps(doc["event"]).encode())[0]
                      for doc in waiting] + ([beat] if beat is not None else [])
            if not events:
                return True
            try:
                self.link.send(events)
            except (httpx.HTTPError, Unauthorized) as exc:
                self._lost(exc)
                return False
            for doc in waiting:
                self.store.delete_record("edge-outbox", str(doc["key"]))
            return True

    def heartbeat(self) -> None:
        data: dict[str, Any] = {"cluster": self.cluster, "labels": self.labels, "serving": self.serving()}
        if self.runtime_url:
            data["endpoint"] = self.runtime_url
        report = None
        if self.link is not None:
            data["position"] = self.position()
            report = self.store.get_record("edge-link", "offline-report")
            if report:
                data["offline"] = report
        if self._emit(None, "edge.heartbeat", data) and report:
            self.store.delete_record("edge-link", "offline-report")

    # -- connectivity (remote) -----------------------------------------------------------------
    def _lost(self, exc: Exception) -> None:
        if self.online.is_set() or not self.store.get_record("edge-link", "offline"):
            log.warning("edge agent %s: gateway unreachable (%s); serving on without it", self.cluster, exc)
            self.store.put_record("edge-link", "offline", {"since": datetime.now(timezone.utc).isoformat(),
                                                           "at": time.time(), "restarts": 0})
        self.online.clear()

    def _found(self) -> None:
        offline = self.store.get_record("edge-link", "offline")
        self.online.set()
        if offline:
            self.store.put_record("edge-link", "offline-report", {
                "since": offline["since"], "until": datetime.now(timezone.utc).isoformat(),
                "seconds": round(max(0.0, time.time() - float(offline["at"])), 3), "serving": self.serving(),
                "restarts": int(offline.get("restarts", 0))})
            self.store.delete_record("edge-link", "offline")
            log.warning("edge agent %s: gateway reachable again", self.cluster)
        self.heartbeat()

    # -- rollout -------------------------------------------------------------------------------
    def _smoke(self, model: str, version: str, sample: Any) -> None:
        body = sample if isinstance(sample, dict) else {"instances": sample}
        reply = httpx.post(f"{self.runtime_url}/v2/models/{model}/versions/{version}/infer"
                           if "inputs" in body else f"{self.runtime_url}/v1/models/{model}:predict",
                           json=body, headers=self.headers, timeout=120)
        if reply.status_code != 200:
            raise RuntimeError(f"smoke test answered {reply.status_code}: {reply.text[:300]}")

    def _artifact(self, d: Mapping[str, Any], timings: dict[str, float]) -> str:
        """Where the target takes the artifact from: over a remote link, the verified copy in this agent's cache."""
        if self.link is None or self.target.name != "local":
            return str(d["artifactUri"])
        started = time.monotonic()
        name = Path(str(d["artifactUri"]).rstrip("/")).name or "artifact"
        path, received = artifacts.download(self.link.artifact_url(str(d["sha256"])), str(d["sha256"]), self.cache,
                                            self.policy, name=name, headers=self.link.headers,
                                            verify=self.link.verify, rate=self.link.rate)
        timings["download"], timings["bytes"] = round(time.monotonic() - started, 3), float(received)
        return path.as_uri()

    def apply(self, event: CloudEvent) -> None:
        d: dict[str, Any] = event.get_data() or {}
        project = str(event.get("project") or "default")
        release = Release.from_event_data(d, project)
        model, version = release.model, release.version
        previous = self.serving().get(model)
        timings: dict[str, float] = {}
        started = time.monotonic()
        try:
            release = replace(release, artifact_uri=self._artifact(d, timings), canary_percent=None)
            sample = self.smoke if self.smoke is not None else d.get("sampleInput")
            staged = self.target.name == "local" and sample is not None
            first = self.target.deploy(replace(release, canary_percent=0) if staged and previous else release)
            timings.update(first.timings)
            if staged:
                self._smoke(model, version, sample)
                if previous:
                    self.target.deploy(release)  # take all traffic
        except (CascadeError, RuntimeError, httpx.HTTPError) as exc:
            reason = exc.args[0] if isinstance(exc, DeployFailed) else str(exc)
            if self.target.name == "local":
                try:
                    self.target.withdraw(model, version, project)  # the previous version (if any) takes all again
                except DeployFailed as again:
                    log.warning("edge agent %s: withdrawing %s %s: %s", self.cluster, model, version, again)
            self._failed(event, model, version, str(reason), previous)
            return
        timings["total"] = round(time.monotonic() - started, 3)
        self.store.put_record("edge-model", model, {"model": model, "version": version, "applied": time.time(),
                                                    "project": project, "release": d,
                                                    "artifact": release.artifact_uri})
        self.store.put_record("edge-attempt", f"{model}:{version}", {"model": model, "version": version,
                                                                      "result": "deployed"})
        data: dict[str, Any] = {"model": model, "version": version, "target": "edge", "cluster": self.cluster,
                                "timings": timings}
        if first.endpoint:
            data["endpoint"] = first.endpoint
        self._emit(event, "model.deployed", data)

    def _failed(self, event: CloudEvent, model: str, version: str, reason: str, previous: str | None) -> None:
        data = {"model": model, "version": version, "target": "edge", "cluster": self.cluster, "reason": reason[:2000]}
        if previous:
            data["serving"] = previous
        self.store.put_record("edge-attempt", f"{model}:{version}", {"model": model, "version": version,
                                                                      "result": "failed"})
        self._emit(event, "model.deploy_failed", data)

    def _wanted(self, event: CloudEvent) -> bool:
        d: dict[str, Any] = event.get_data() or {}
        if not selects(d.get("targets"), self.labels) and self.link is None:
            return False  # over a remote link the gateway chose what this cluster sees
        if self.store.get_record("edge-attempt", f"{d['model']}:{d['version']}"):
            return False  # applied (or refused) before a restart: never again
        current = self.serving().get(str(d["model"]))
        return current is None or version_key(str(d["version"])) > version_key(current)

    def take(self, events: list[CloudEvent]) -> None:
        """Apply the newest wanted release per model of ``events`` (older ones are superseded); skip expired ones."""
        newest: dict[str, CloudEvent] = {}
        for event in events:
            if event["type"] != RELEASED or not self._wanted(event):
                continue
            data: dict[str, Any] = event.get_data() or {}
            expired = _expired(data)
            if expired:
                self._failed(event, str(data["model"]), str(data["version"]),
                             f"skipped: the release expired at {expired} (notAfter) before this cluster received it",
                             self.serving().get(str(data["model"])))
                continue
            held = newest.get(str(data["model"]))
            if held is None or version_key(str(data["version"])) >= version_key(str((held.get_data() or {})["version"])):
                newest[str(data["model"])] = event
        for event in newest.values():
            self.apply(event)

    def restore(self) -> None:
        """After a restart, serve again what this cluster served (from the checksum cache), connected or not."""
        releases = [replace(Release.from_event_data(r["release"], str(r.get("project", "default"))),
                            artifact_uri=str(r["artifact"]), canary_percent=None)
                    for r in self.store.find_records("edge-model") if r.get("release")]
        for failed in self.target.restore(releases):
            log.warning("edge agent %s: %s did not serve again after the restart", self.cluster, failed)

    # -- the loops -----------------------------------------------------------------------------
    def run(self) -> None:
        self.restore()
        if self.link is not None:
            self._run_remote()
        else:
            self._run_bus()

    def _run_bus(self) -> None:
        assert self.bus is not None
        consumer = self.bus.subscribe([self.topic], f"{self.topic}.edge.{self.cluster}", start="earliest")
        last_beat = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() - last_beat >= self.heartbeat_every:
                    self.heartbeat()
                    last_beat = time.monotonic()
                records = consumer.poll(0.5)
                events = []
                for record in records:
                    try:
                        events.append(record.event())
                    except InvalidEvent:
                        continue
                self.take(events)
                for record in records:
                    consumer.ack(record)
        finally:
            consumer.close()

    def _run_remote(self) -> None:
        assert self.link is not None
        offline = self.store.get_record("edge-link", "offline")
        if offline:  # started again without a connection: it counts in the report
            self.store.put_record("edge-link", "offline", {**offline, "restarts": int(offline.get("restarts", 0)) + 1})
        beats = threading.Thread(target=self._beat_loop, name="edge-heartbeat", daemon=True)
        beats.start()
        backoff = 0.2
        while not self._stop.is_set():
            try:
                for batch in self.link.stream(self.position()):
                    if not self.online.is_set():
                        self._found()
                        backoff = 0.2
                    if batch:
                        self.take([event for _, event in batch])
                        self.store.put_record("edge-link", "position", {"seq": batch[-1][0]})
                    if self._stop.is_set():
                        break
            except (httpx.HTTPError, Unauthorized, OSError) as exc:
                self._lost(exc)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)
        beats.join(5)

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_every):
            if self.online.is_set():
                self.heartbeat()

    def stop(self) -> None:
        self._stop.set()


def fleet(records: list[CloudEvent]) -> dict[str, dict[str, Any]]:
    """The latest heartbeat per cluster."""
    out: dict[str, dict[str, Any]] = {}
    for event in records:
        data: dict[str, Any] = event.get_data() or {}
        out[data["cluster"]] = {**data, "time": event.get("time", "")}
    return out

