"""The ``release-model`` and ``deploy-model`` functions' logic.

release: a ``job.succeeded`` whose spec names a ``model`` is registered (``model.registered``
with the artifact's sha256 and lineage) and, when its metrics pass the spec's release gate,
released (``model.released``). deploy: a ``model.released`` is fetched into the checksum
cache and deployed to the local runtime (or as a KServe InferenceService); the answer is
``model.deployed`` or ``model.deploy_failed``, and a failed version never takes traffic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from cloudevents.http import CloudEvent

from cascade.core.hashing import sha256_file
from cascade.core.settings import Settings
from cascade.events.envelope import follow_up
from cascade.events.expressions import Expression
from cascade.serving.registry import Registry
from cascade.serving.targets import DeployFailed, DeployTarget, Release, open_target
from cascade.stores import open_store

SOURCE_RELEASE = "/cascade/functions/release-model"
SOURCE_DEPLOY = "/cascade/functions/deploy-model"


class Models:
    def __init__(self, cfg: Settings) -> None:
        self.cfg = cfg
        self.store = open_store(self.cfg.state_url)
        self.registry = Registry(self.store)
        self._target: DeployTarget | None = None

    @property
    def target(self) -> DeployTarget:
        """Opened on first use: release-model never needs one."""
        if self._target is None:
            self._target = open_target(self.cfg)
        return self._target

    # -- release-model --------------------------------------------------------------------
    def on_succeeded(self, event: CloudEvent) -> list[CloudEvent]:
        data: dict[str, Any] = event.get_data() or {}
        job = self.store.get_record("job", str(data["jobId"])) or {}
        if job.get("kind") == "finetune":
            return self._register_finetune(event, data, job)
        model = (job.get("spec") or {}).get("model")
        if not model:
            return []
        output = Path(unquote(urlparse(str(data["artifactUri"])).path)).resolve()
        path = (output / model["file"]).resolve()
        if not path.is_relative_to(output) or not path.is_file():
            return []  # model.file names a file inside the job's own output, or nothing is registered
        existing = [v for v in self.registry.versions(model["name"]) if v.get("lineage", {}).get("job") == data["jobId"]]
        version = existing[0]["version"] if existing else self.registry.next_version(model["name"])
        record = {"model": model["name"], "version": version, "artifactUri": path.as_uri(),
                  "sha256": sha256_file(path), "format": model.get("format", "torchscript"),
                  "framework": job["spec"].get("framework", ""), "metrics": data.get("metrics", {}),
                  "lineage": {"job": data["jobId"], **({"dataset": job["spec"]["dataset"]}
                                                      if job["spec"].get("dataset") else {})},
                  **({"signature": model["signature"]} if model.get("signature") else {})}
        self.registry.register(record, str(job.get("project") or "default"))
        out = [follow_up(event, "model.registered", record, source=SOURCE_RELEASE, partitionkey=model["name"],
                         subject=f"{model['name']}:{version}", id=f"registered-{model['name']}-{version}")]
        release = model.get("release")
        if release is not None:
            gate = release.get("when")
            if not gate or Expression.compile(gate).matches(record["metrics"]):
                released = self.registry.release(model["name"], version, targets=release.get("targets"),
                                                 canary=release.get("canaryTrafficPercent"),
                                                 sample=release.get("sampleInput"))
                out.append(follow_up(event, "model.released", released.get_data() or {}, source=SOURCE_RELEASE,
                                     partitionkey=model["name"], subject=released["subject"], id=released["id"]))
        return out

    def _register_finetune(self, event: CloudEvent, data: dict[str, Any], job: dict[str, Any]) -> list[CloudEvent]:
        spec = job.get("finetune") or {}
        folder = "model" if spec.get("method") == "full" else "adapter"
        path = Path(unquote(urlparse(str(data["artifactUri"])).path)) / folder
        if not spec or not path.exists():
            return []
        name = str(spec["outputModel"])
        existing = [v for v in self.registry.versions(name) if v.get("lineage", {}).get("job") == data["jobId"]]
        version = existing[0]["version"] if existing else self.registry.next_version(name)
        record = {"model": name, "version": version, "artifactUri": path.as_uri(), "sha256": sha256_file(path),
                  "format": "huggingface" if folder == "model" else "lora-adapter", "framework": "pytorch",
                  "metrics": data.get("metrics", {}),
                  "lineage": {"job": data["jobId"], "dataset": spec["dataset"], "baseModel": spec["baseModel"]}}
        self.registry.register(record, str(job.get("project") or "default"))
        return [follow_up(event, "model.registered", record, source=SOURCE_RELEASE, partitionkey=name,
                          subject=f"{name}:{version}", id=f"registered-{name}-{version}")]

    # -- deploy-model ---------------------------------------------------------------------
    def on_released(self, event: CloudEvent) -> CloudEvent:
        d: dict[str, Any] = event.get_data() or {}
        release = Release.from_event_data(d, str(event.get("project") or "default"))
        head = {"model": release.model, "version": release.version, "target": self.target.name}
        try:
            deployed = self.target.deploy(release)
        except DeployFailed as exc:
            body: dict[str, Any] = {**head, "reason": str(exc)[:2000]}
            if exc.serving:
                body["serving"] = exc.serving
            return follow_up(event, "model.deploy_failed", body, source=SOURCE_DEPLOY, partitionkey=release.model,
                             subject=f"{release.model}:{release.version}")
        data: dict[str, Any] = {**head, "timings": dict(deployed.timings)}
        if deployed.endpoint:
            data["endpoint"] = deployed.endpoint
        return follow_up(event, "model.deployed", data, source=SOURCE_DEPLOY, partitionkey=release.model,
                         subject=f"{release.model}:{release.version}")
