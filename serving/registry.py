"""The model registry: models, their versions, artifacts, checksums, lineage and stage.

Versions live in the state store as ``model-version`` records (``<model>:<version>``),
indexed by model and stage. Releasing a version marks it ``released`` and makes the
``model.released`` event that deployers (the ``deploy-model`` function, edge agents) act on.

Each release is a command with its own id, so releasing the same version again (a rollback,
a redeploy) always reaches the deployers. Two traffic splits are kept per model: ``desired``
(what the last central command asked for) and ``live`` (what the central target last
confirmed serving); on start the platform makes ``live`` serve again.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import NotFound
from cascade.core.versions import version_key
from cascade.events.envelope import new_event
from cascade.serving.targets.base import Release
from cascade.stores import StateStore

SOURCE = "/cascade/registry"
INDEX = ("model", "stage")
DESIRED, LIVE = "model-desired", "model-live"


def traffic_after(current: dict[str, int], version: str, canary: int | None) -> dict[str, int]:
    """The split a release of ``version`` (``canary`` percent, or all) makes of ``current``: the version with
    the most traffic keeps the rest, any other is dropped (the runtime's and KServe's rule)."""
    others = {v: p for v, p in current.items() if v != version}
    if canary is not None and others and canary < 100:
        stable = max(others, key=lambda v: others[v])
        return {stable: 100 - canary, version: canary}
    return {version: 100}


class Registry:
    def __init__(self, store: StateStore) -> None:
        self.store = store

    def versions(self, model: str) -> list[dict[str, Any]]:
        return sorted(self.store.find_records("model-version", model=model), key=lambda r: version_key(r["version"]))

    def models(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for record in self.store.find_records("model-version"):
            out.setdefault(record["model"], []).append(record)
        return out

    def get(self, model: str, version: str) -> dict[str, Any]:
        record = self.store.get_record("model-version", f"{model}:{version}")
        if record is None:
            known = [r["version"] for r in self.versions(model)]
            raise NotFound(f"model {model} has no version {version!r}; versions: {known or 'none'}")
        return record

    def next_version(self, model: str) -> str:
        numbers = [int(r["version"]) for r in self.versions(model) if str(r["version"]).isdigit()]
        return str(max(numbers, default=0) + 1)

    def register(self, data: dict[str, Any], project: str = "default") -> dict[str, Any]:
        """Add a version of ``project`` (the data of a ``model.registered`` event); idempotent per model and version."""
        key = f"{data['model']}:{data['version']}"
        existing = self.store.get_record("model-version", key)
        if existing is not None:
            return existing
        record = {**data, "project": project, "stage": "registered",
                  "registered": datetime.now(timezone.utc).isoformat()}
        self.store.put_record("model-version", key, record, index=INDEX)
        return record

    def traffic(self, kind: str, model: str) -> dict[str, int]:
        """The ``desired`` or ``live`` split of ``model`` (empty: none)."""
        record = self.store.get_record(kind, model)
        return {str(v): int(p) for v, p in (record or {}).get("traffic", {}).items()}

    def set_traffic(self, kind: str, model: str, traffic: dict[str, int], project: str) -> None:
        if traffic:
            self.store.put_record(kind, model, {"model": model, "project": project, "traffic": traffic,
                                                "updated": datetime.now(timezone.utc).isoformat()})
        else:
            self.store.delete_record(kind, model)

    def deployments(self, kind: str = LIVE) -> list[dict[str, Any]]:
        return self.store.find_records(kind)

    def live_releases(self) -> list[Release]:
        """What restores the ``live`` splits: per model its main version first, then the other as a canary."""
        out = []
        for record in self.deployments(LIVE):
            order = sorted(record.get("traffic", {}).items(), key=lambda item: -int(item[1]))
            for i, (version, percent) in enumerate(order):
                v = self.store.get_record("model-version", f"{record['model']}:{version}")
                if v is not None:
                    out.append(Release(str(record["model"]), str(version), str(v["artifactUri"]), str(v["sha256"]),
                                       str(v["format"]), str(record.get("project") or "default"),
                                       None if i == 0 else int(percent), v.get("signature")))
        return out

    def release(self, model: str, version: str, *, targets: dict[str, Any] | None = None,
                canary: int | None = None, sample: Any = None, accelerator: str = "0", command: str = "",
                central: bool = True, resources: dict[str, str] | None = None,
                edge: dict[str, Any] | None = None) -> CloudEvent:
        """The ``model.released`` command for ``version``; ``command`` makes its id (a new one for each
        command a user gives, one derived from the triggering event for automatic releases); ``central``:
        whether the central target deploys it (else only edge clusters), which moves the desired split;
        ``edge``: what only edge clusters read (``notAfter``, ``rollout``)."""
        record = self.get(model, version)
        if central:
            self.set_traffic(DESIRED, model, traffic_after(self.traffic(DESIRED, model), version, canary),
                             str(record.get("project") or "default"))
        data: dict[str, Any] = {"model": model, "version": version, "artifactUri": record["artifactUri"],
                                "sha256": record["sha256"], "format": record["format"], "accelerator": accelerator}
        if targets:
            data["targets"] = targets
        if resources:
            data["resources"] = dict(resources)
        if canary is not None:
            data["canaryTrafficPercent"] = canary
        if sample is not None:
            data["sampleInput"] = sample
        if record.get("signature"):
            data["signature"] = record["signature"]
        data.update(edge or {})
        self.store.put_record("model-version", f"{model}:{version}",
                              {**record, "stage": "released", "released": datetime.now(timezone.utc).isoformat()},
                              index=INDEX)
        command = command or uuid.uuid4().hex[:16]
        return new_event("model.released", data, source=SOURCE, partitionkey=model, subject=f"{model}:{version}",
                         id=f"release-{model}-{version}-{command}",
                         extensions={"project": str(record.get("project") or "default")})
