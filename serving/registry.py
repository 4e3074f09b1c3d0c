"""The model registry: models, their versions, artifacts, checksums, lineage and stage.

Versions live in the state store as ``model-version`` records (``<model>:<version>``),
indexed by model and stage. Releasing a version marks it ``released`` and makes the
``model.released`` event that deployers (the ``deploy-model`` function, edge agents) act on.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import NotFound
from cascade.core.versions import version_key
from cascade.events.envelope import new_event
from cascade.stores import StateStore

SOURCE = "/cascade/registry"
INDEX = ("model", "stage")


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

    def release(self, model: str, version: str, *, targets: dict[str, Any] | None = None,
                canary: int | None = None, sample: Any = None, accelerator: str = "0") -> CloudEvent:
        record = self.get(model, version)
        data: dict[str, Any] = {"model": model, "version": version, "artifactUri": record["artifactUri"],
                                "sha256": record["sha256"], "format": record["format"], "accelerator": accelerator}
        if targets:
            data["targets"] = targets
        if canary is not None:
            data["canaryTrafficPercent"] = canary
        if sample is not None:
            data["sampleInput"] = sample
        if record.get("signature"):
            data["signature"] = record["signature"]
        self.store.put_record("model-version", f"{model}:{version}",
                              {**record, "stage": "released", "released": datetime.now(timezone.utc).isoformat()},
                              index=INDEX)
        return new_event("model.released", data, source=SOURCE, partitionkey=model, subject=f"{model}:{version}",
                         id=f"release-{model}-{version}-{canary if canary is not None else 100}")
