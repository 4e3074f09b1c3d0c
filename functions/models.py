"""The ``release-model`` and ``deploy-model`` functions' logic.

release: a ``job.succeeded`` whose spec names a ``model`` is registered (``model.registered``
with the artifact's sha256 and lineage) and, when its metrics pass the spec's release gate,
released (``model.released``). deploy: a ``model.released`` is fetched into the checksum
cache and deployed to the local runtime (or as a KServe InferenceService); the answer is
``model.deployed`` or ``model.deploy_failed`` (whatever went wrong, with the reason: a failure
is never only a dead letter), and a failed version never takes traffic. A release aimed only
at edge clusters (its ``targets`` do not select ``serving.cluster_labels``) is left to them.
After a deployment the split the target reports becomes the model's ``live`` traffic, which
the platform restores on start.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from cloudevents.http import CloudEvent

from cascade.core.hashing import sha256_file
from cascade.core.settings import Settings
from cascade.events.edge import selects
from cascade.events.envelope import follow_up
from cascade.events.expressions import Expression
from cascade.serving.registry import LIVE, Registry, traffic_after
from cascade.serving.targets import DeployFailed, DeployTarget, Release, open_target
from cascade.stores import open_store

SOURCE_RELEASE = "/cascade/functions/release-model"
SOURCE_DEPLOY = "/cascade/functions/deploy-model"
log = logging.getLogger("cascade.functions.models")


class Models:
    def __init__(self, cfg: Settings) -> None:
        self.cfg = cfg
        self.store = open_store(self.cfg.state_url)
        self.registry = Registry(self.store)
        self._target: DeployTarget | None = None

    def central(self, targets: dict[str, Any] | None) -> bool:
        return self.central_for(self.cfg, targets)

    @staticmethod
    def central_for(cfg: Settings, targets: dict[str, Any] | None) -> bool:
        """Whether a release with these ``targets`` is deployed centrally too (not only on edge clusters)."""
        return selects(targets, cfg.serving.cluster_labels)

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
        if model.get("format") == "pytorch" and path.is_file():
            path = self._state_dict_bundle(output, path, model["name"])
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
                command = hashlib.sha256(f"{event['source']}\x00{event['id']}".encode()).hexdigest()[:16]
                released = self.registry.release(model["name"], version, targets=release.get("targets"),
                                                 canary=release.get("canaryTrafficPercent"),
                                                 sample=release.get("sampleInput"), command=command,
                                                 central=self.central(release.get("targets")))
                out.append(follow_up(event, "model.released", released.get_data() or {}, source=SOURCE_RELEASE,
                                     partitionkey=model["name"], subject=released["subject"], id=released["id"]))
        return out

    @staticmethod
    def _state_dict_bundle(output: Path, weights: Path, name: str) -> Path:
        """A state dict's weights and the ``arch.json`` beside them, as one folder: the artifact, its sha256 and
        every copy of it then carry the architecture (a weights file alone cannot be served)."""
        arch = weights.parent / "arch.json"
        bundle = output / ".cascade-models" / name
        if bundle.exists():
            shutil.rmtree(bundle)
        bundle.mkdir(parents=True)
        shutil.copyfile(weights, bundle / weights.name)
        if arch.is_file() and not arch.is_symlink() and arch.resolve().is_relative_to(output):
            shutil.copyfile(arch, bundle / "arch.json")
        return bundle

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
    def on_released(self, event: CloudEvent) -> CloudEvent | None:
        d: dict[str, Any] = event.get_data() or {}
        release = Release.from_event_data(d, str(event.get("project") or "default"))
        if not self.central(d.get("targets")):
            log.info("%s:%s is released to edge clusters only; not deployed centrally", release.model, release.version)
            return None
        head = {"model": release.model, "version": release.version, "target": self.target.name}
        subject = f"{release.model}:{release.version}"
        try:
            deployed = self.target.deploy(release)
        except Exception as exc:  # whatever it was, the release ends as model.deploy_failed with the reason
            reason = str(exc) if isinstance(exc, DeployFailed) else f"{type(exc).__name__}: {exc}"
            body: dict[str, Any] = {**head, "reason": reason[:2000]}
            serving = exc.serving if isinstance(exc, DeployFailed) else None
            live = self.registry.traffic(LIVE, release.model)
            if serving or live:
                body["serving"] = serving or max(live, key=lambda v: live[v])
            return follow_up(event, "model.deploy_failed", body, source=SOURCE_DEPLOY, partitionkey=release.model,
                             subject=subject)
        live = self.target.serving(release.model, release.project) or \
            traffic_after(self.registry.traffic(LIVE, release.model), release.version, release.canary_percent)
        self.registry.set_traffic(LIVE, release.model, live, release.project)
        data: dict[str, Any] = {**head, "timings": dict(deployed.timings)}
        if deployed.endpoint:
            data["endpoint"] = deployed.endpoint
        return follow_up(event, "model.deployed", data, source=SOURCE_DEPLOY, partitionkey=release.model,
                         subject=subject)

    def on_withdrawn(self, event: CloudEvent) -> CloudEvent | None:
        d: dict[str, Any] = event.get_data() or {}
        model, version, project = str(d["model"]), str(d["version"]), str(event.get("project") or "default")
        if not self.central(d.get("targets")):
            return None
        try:
            live = self.target.withdraw(model, version, project)
        except Exception as exc:  # the version may still serve: say so, never only a dead letter
            reason = str(exc) if isinstance(exc, DeployFailed) else f"{type(exc).__name__}: {exc}"
            return follow_up(event, "model.deploy_failed", {"model": model, "version": version,
                                                            "target": self.target.name,
                                                            "reason": f"withdrawing: {reason}"[:2000]},
                             source=SOURCE_DEPLOY, partitionkey=model, subject=f"{model}:{version}")
        self.registry.set_traffic(LIVE, model, live, project)
        return None
