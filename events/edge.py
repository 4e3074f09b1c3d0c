"""Remote edge clusters: their credentials, the release feed they follow, staged rollouts, fleet status.

An edge site behind NAT has no route to the broker: it registers once (``cascade edge register``
issues a per-cluster credential; the store keeps only its SHA-256) and follows the **release
feed** over the gateway's HTTPS endpoint. The feed is an append-only, numbered list of
``model.released`` events in the state store, each with its audience (the release's label
selector, and for a staged rollout the clusters of the wave it opens); a cluster's position is
the number of the last entry it handled, so a reconnect after hours resumes exactly there
(``Last-Event-ID``). The ``edge-feed`` platform function appends to it from the bus and opens a
rollout's next wave once every cluster of the current one reported ``model.deployed`` (each
agent's smoke test is the health gate); one ``model.deploy_failed`` halts the rollout.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from cloudevents.conversion import to_dict
from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput, NotFound
from cascade.core.versions import version_key
from cascade.events.envelope import event_type
from cascade.stores import StateStore
from cascade.stores.base import RecordWrite

_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
PREFIX = "cas_edge_"
HEAD = "edge-feed:head"
RELEASED, DEPLOYED, FAILED = event_type("model.released"), event_type("model.deployed"), event_type("model.deploy_failed")
HEARTBEAT = event_type("edge.heartbeat")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
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


def now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Clusters:
    """Registered edge clusters and their credentials."""

    def __init__(self, store: StateStore) -> None:
        self.store = store

    def register(self, name: str, labels: Mapping[str, str]) -> str:
        """Register (or re-register, which replaces the credential and the labels) ``name``; the credential is
        returned this once."""
        if not _NAME.match(name):
            raise InvalidInput(f"cluster name {name!r} must be lowercase letters, digits and '-', at most 63 "
                               "characters", field="cluster")
        old = self.store.get_record("edge-cluster", name)
        if old is not None:
            self.store.delete_record("edge-credential", str(old["digest"]))
        token = PREFIX + secrets.token_urlsafe(24)
        digest = _digest(token)
        self.store.put_record("edge-credential", digest, {"cluster": name})
        self.store.put_record("edge-cluster", name, {"name": name, "labels": dict(labels), "digest": digest,
                                                     "registered": now()})
        return token

    def revoke(self, name: str) -> None:
        record = self.store.get_record("edge-cluster", name)
        if record is None:
            raise NotFound(f"no edge cluster {name!r}; list them with: cascade edge ls")
        self.store.delete_record("edge-credential", str(record["digest"]))
        self.store.delete_record("edge-cluster", name)

    def lookup(self, token: str) -> dict[str, Any] | None:
        """The cluster a credential belongs to (without its digest), or None."""
        if not token.startswith(PREFIX):
            return None
        found = self.store.get_record("edge-credential", _digest(token))
        record = self.store.get_record("edge-cluster", str(found["cluster"])) if found else None
        if record is None or record.get("digest") != _digest(token):
            return None
        return {k: v for k, v in record.items() if k != "digest"}

    def all(self) -> list[dict[str, Any]]:
        return sorted(({k: v for k, v in r.items() if k != "digest"} for r in self.store.find_records("edge-cluster")),
                      key=lambda r: str(r["name"]))


def waves(rollout: Mapping[str, Any] | None, audience: Iterable[str]) -> list[list[str]] | None:
    """The waves of a staged rollout over the registered clusters in ``audience`` (sorted by name): the listed
    ones, or cumulative percentages (``[20, 100]``: the first fifth, then the rest). None: all at once."""
    if not rollout:
        return None
    clusters = sorted(audience)
    if rollout.get("waves"):
        listed = [[c for c in wave if c in clusters] for wave in rollout["waves"]]
        rest = [c for c in clusters if not any(c in w for w in listed)]
        return [w for w in listed if w] + ([rest] if rest and rollout.get("rest", True) else [])
    out, taken = [], 0
    for percent in rollout.get("percent") or [100]:
        upto = min(len(clusters), math.ceil(len(clusters) * float(percent) / 100))
        if upto > taken:
            out.append(clusters[taken:upto])
            taken = upto
    if taken < len(clusters):
        out.append(clusters[taken:])
    return out


class Feed:
    """The numbered release feed and the rollouts it carries."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.clusters = Clusters(store)

    def head(self) -> int:
        raw = self.store.get(HEAD)
        return int(raw) if raw else 0

    def _append(self, entry: dict[str, Any]) -> int:
        """Number and store an entry; the release and its artifact remember who may see them."""
        data = entry["event"].get("data") or {}
        audience = {"selector": entry["selector"], "clusters": entry["clusters"]}
        for kind, key, base in (("edge-release", f"{data['model']}:{data['version']}",
                                 {"project": entry["event"].get("project") or "default"}),
                                ("edge-artifact", str(data["sha256"]), {"uri": data["artifactUri"]})):
            record = self.store.get_record(kind, key) or {**base, "entries": []}
            if audience not in record["entries"]:
                record["entries"].append(audience)
            self.store.put_record(kind, key, record)
        while True:
            raw = self.store.get(HEAD)
            seq = (int(raw) if raw else 0) + 1
            if self.store.commit_records(HEAD, raw, str(seq).encode(),
                                         [RecordWrite("edge-feed", f"{seq:012d}", {**entry, "seq": seq})]):
                return seq

    def release(self, model: str, version: str) -> dict[str, Any] | None:
        """The project of a release on the feed and the audiences it reached (``entries``)."""
        return self.store.get_record("edge-release", f"{model}:{version}")

    def artifact(self, sha256: str) -> dict[str, Any] | None:
        """Where an artifact of the feed lies and the audiences of its releases (``entries``)."""
        return self.store.get_record("edge-artifact", sha256)

    def entries(self, after: int, upto: int | None = None) -> list[dict[str, Any]]:
        last = self.head() if upto is None else upto
        out = []
        for seq in range(after + 1, last + 1):
            entry = self.store.get_record("edge-feed", f"{seq:012d}")
            if entry is not None:
                out.append(entry)
        return out

    @staticmethod
    def sees(entry: Mapping[str, Any], cluster: str, labels: Mapping[str, str]) -> bool:
        if entry.get("clusters") is not None and cluster not in entry["clusters"]:
            return False
        return selects(entry.get("selector"), labels)

    def for_cluster(self, cluster: str, labels: Mapping[str, str], after: int,
                    limit: int = 500) -> tuple[list[dict[str, Any]], int]:
        """The entries after ``after`` (at most ``limit`` read) this cluster sees, and where reading stopped."""
        upto = min(self.head(), after + limit)
        return [e for e in self.entries(after, upto) if self.sees(e, cluster, labels)], upto

    # -- what the edge-feed function does with each event ------------------------------------
    def ingest(self, event: CloudEvent) -> None:
        kind = event["type"]
        if kind == RELEASED:
            self._released(event)
        elif kind in (DEPLOYED, FAILED) and (event.get_data() or {}).get("target") == "edge":
            self._outcome(event)

    def _released(self, event: CloudEvent) -> None:
        if self.store.get_record("edge-feed-id", str(event["id"])):
            return  # delivered again: already in the feed
        d: dict[str, Any] = event.get_data() or {}
        selector = d.get("targets")
        audience = [c["name"] for c in self.clusters.all() if selects(selector, c["labels"])]
        plan = waves(d.get("rollout"), audience)
        wire = to_dict(event)
        key = f"{d['model']}:{d['version']}"
        if plan is not None:
            self.store.put_record("edge-rollout", key, {"model": d["model"], "version": d["version"], "waves": plan,
                                                        "wave": 0, "status": "running" if plan else "done",
                                                        "results": {}, "event": wire, "selector": selector,
                                                        "started": now()})
        first = None if plan is None else (plan[0] if plan else [])  # a rollout over no cluster reaches none
        seq = self._append({"event": wire, "selector": selector, "clusters": first,
                            "wave": 0 if plan is not None else None})
        self.store.put_record("edge-feed-id", str(event["id"]), {"seq": seq})

    def _outcome(self, event: CloudEvent) -> None:
        d: dict[str, Any] = event.get_data() or {}
        cluster, key = str(d.get("cluster", "")), f"{d['model']}:{d['version']}"
        if event["type"] == DEPLOYED:
            status = self.status(cluster)
            self.note(cluster, serving={**(status.get("serving") or {}), str(d["model"]): str(d["version"])})
        rollout = self.store.get_record("edge-rollout", key)
        if rollout is None or rollout["status"] != "running":
            return
        wave = rollout["waves"][rollout["wave"]]
        if cluster not in wave:
            return
        rollout["results"][cluster] = "deployed" if event["type"] == DEPLOYED else "failed"
        if event["type"] == FAILED:
            rollout.update(status="halted", reason=f"wave {rollout['wave'] + 1}: {cluster}: {d.get('reason', '')}"[:500])
        elif all(rollout["results"].get(c) == "deployed" for c in wave):
            if rollout["wave"] + 1 < len(rollout["waves"]):
                rollout["wave"] += 1
                self.store.put_record("edge-rollout", key, rollout)  # the next wave opens at most once
                self._append({"event": rollout["event"], "selector": rollout["selector"],
                              "clusters": rollout["waves"][rollout["wave"]], "wave": rollout["wave"]})
                return
            rollout["status"] = "done"
        self.store.put_record("edge-rollout", key, rollout)

    def rollouts(self) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "event"} for r in self.store.find_records("edge-rollout")]

    # -- fleet status ----------------------------------------------------------------------------
    def status(self, cluster: str) -> dict[str, Any]:
        return self.store.get_record("edge-status", cluster) or {"cluster": cluster}

    def note(self, cluster: str, **fields: Any) -> None:
        """Record what a cluster said (None values leave a field as it was) and when."""
        status = self.status(cluster)
        status.update({k: v for k, v in fields.items() if v is not None}, lastContact=now(), contact=time.time())
        self.store.put_record("edge-status", cluster, status)

    def fleet(self, beats: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Per cluster: labels, desired and actual versions, last contact, lag (feed entries it has yet to see).
        ``beats``: the latest heartbeat of each agent on the bus (cluster -> its data, with ``time``)."""
        registered = {c["name"]: c for c in self.clusters.all()}
        statuses = {s["cluster"]: s for s in self.store.find_records("edge-status")}
        for name, beat in (beats or {}).items():
            if name not in registered:
                statuses[name] = {**statuses.get(name, {}), "cluster": name, "labels": beat.get("labels") or {},
                                  "serving": beat.get("serving") or {}, "lastContact": str(beat.get("time", ""))}
        entries = self.entries(0)
        out = []
        for name in sorted(set(registered) | set(statuses)):
            labels = (registered.get(name) or statuses[name]).get("labels") or {}
            status = statuses.get(name, {})
            desired: dict[str, str] = {}
            seen = [e for e in entries if self.sees(e, name, labels)]
            for entry in seen:
                data = entry["event"].get("data") or {}
                model, version = str(data["model"]), str(data["version"])
                if model not in desired or version_key(version) > version_key(desired[model]):
                    desired[model] = version
            position = status.get("position")
            out.append({"cluster": name, "labels": labels, "registered": name in registered, "desired": desired,
                        "serving": status.get("serving") or {}, "lastContact": status.get("lastContact", ""),
                        "lag": sum(1 for e in seen if e["seq"] > position) if isinstance(position, int) else None,
                        "mode": "https" if name in registered else "kafka"})
        return out


def frame(entry: Mapping[str, Any]) -> str:
    """One Server-Sent Events message: the feed number as its id, the structured CloudEvent as data."""
    return f"id: {entry['seq']}\nevent: {entry['event'].get('type', '')}\ndata: {json.dumps(entry['event'])}\n\n"
