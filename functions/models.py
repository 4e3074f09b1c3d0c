"""The ``release-model`` and ``deploy-model`` functions' logic.

release: a ``job.succeeded`` whose spec names a ``model`` is registered (``model.registered``
with the artifact's sha256 and lineage) and, when its metrics pass the spec's release gate,
released (``model.released``). deploy: a ``model.released`` is fetched into the checksum
cache and deployed to the local runtime (or as a KServe InferenceService); the answer is
``model.deployed`` or ``model.deploy_failed``, and a failed version never takes traffic.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import httpx
from cloudevents.http import CloudEvent

from cascade.core.errors import CascadeError
from cascade.core.settings import Settings
from cascade.stores import open_store
from cascade.events.envelope import follow_up
from cascade.events.expressions import Expression
from cascade.serving import artifacts
from cascade.serving.registry import Registry
from cascade.core.hashing import sha256_file

SOURCE_RELEASE = "/cascade/functions/release-model"
SOURCE_DEPLOY = "/cascade/functions/deploy-model"


class Models:
    def __init__(self, cfg: Settings | None = None) -> None:
        self.cfg = cfg or Settings()
        self.store = open_store(self.cfg.state_url)
        self.registry = Registry(self.store)

    # -- release-model --------------------------------------------------------------------
    def on_succeeded(self, event: CloudEvent) -> list[CloudEvent]:
        data: dict[str, Any] = event.get_data() or {}
        job = self.store.get_record("job", str(data["jobId"])) or {}
        if job.get("kind") == "finetune":
            return self._register_finetune(event, data, job)
        model = (job.get("spec") or {}).get("model")
        if not model:
            return []
        path = Path(unquote(urlparse(str(data["artifactUri"])).path)) / model["file"]
        if not path.exists():
            return []
        existing = [v for v in self.registry.versions(model["name"]) if v.get("lineage", {}).get("job") == data["jobId"]]
        version = existing[0]["version"] if existing else self.registry.next_version(model["name"])
        record = {"model": model["name"], "version": version, "artifactUri": path.as_uri(),
                  "sha256": sha256_file(path), "format": model.get("format", "torchscript"),
                  "framework": job["spec"].get("framework", ""), "metrics": data.get("metrics", {}),
                  "lineage": {"job": data["jobId"], **({"dataset": job["spec"]["dataset"]}
                                                      if job["spec"].get("dataset") else {})}}
        self.registry.register(record)
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
        self.registry.register(record)
        return [follow_up(event, "model.registered", record, source=SOURCE_RELEASE, partitionkey=name,
                          subject=f"{name}:{version}", id=f"registered-{name}-{version}")]

    # -- deploy-model ---------------------------------------------------------------------
    def on_released(self, event: CloudEvent) -> CloudEvent:
        d: dict[str, Any] = event.get_data() or {}
        model, version = str(d["model"]), str(d["version"])

        def failed(reason: str, serving: list[str] | None = None) -> CloudEvent:
            body: dict[str, Any] = {"model": model, "version": version, "target": "local", "reason": reason[:2000]}
            if serving:
                body["serving"] = serving[0]
            return follow_up(event, "model.deploy_failed", body, source=SOURCE_DEPLOY, partitionkey=model,
                             subject=f"{model}:{version}")

        if self.cfg.serving.target == "kserve":
            return self.to_kserve(event, d, failed)
        started = time.monotonic()
        try:
            local = artifacts.fetch(str(d["artifactUri"]), str(d["sha256"]), self.cfg.model_cache)
        except CascadeError as exc:
            return failed(str(exc))
        fetched = time.monotonic() - started
        url = f"{self.cfg.runtime_url}/_runtime/models/{model}/versions/{version}"
        body: dict[str, Any] = {"artifact": str(local), "format": d["format"], "annotations": self.cfg.serving.annotations}
        if d.get("canaryTrafficPercent") is not None:
            body["canaryTrafficPercent"] = d["canaryTrafficPercent"]
        try:
            reply = httpx.put(url, json=body, timeout=300)
        except httpx.HTTPError as exc:
            return failed(f"runtime unreachable at {url}: {exc}")
        answer = reply.json()
        if reply.status_code != 200:
            return failed(f"{answer.get('message', reply.text)}: {answer.get('log', '')[-800:]}", answer.get("serving"))
        data = {"model": model, "version": version, "target": "local",
                "endpoint": f"{self.cfg.runtime_url}/v1/models/{model}:predict",
                "timings": {"download": round(fetched, 3), "load": float(answer.get("loadSeconds", 0.0))}}
        return follow_up(event, "model.deployed", data, source=SOURCE_DEPLOY, partitionkey=model,
                         subject=f"{model}:{version}")

    def to_kserve(self, event: CloudEvent, d: dict[str, Any], failed: Any) -> CloudEvent:
        """Server-side apply an InferenceService and watch its Ready condition."""
        from kubernetes import config as kube_config

        from cascade.serving import kserve

        model, version = str(d["model"]), str(d["version"])
        namespace = f"{self.cfg.training.namespace_prefix}{event.get('project') or 'default'}"
        live = [v for v in self.registry.versions(model) if v.get("stage") == "released" and v["version"] != version]
        resource = kserve.inference_service(d, namespace, previous_live=bool(live))
        api = kube_config.new_client_from_config()  # type: ignore[no-untyped-call]
        started = time.monotonic()
        try:
            kserve.apply(api, resource)
            while time.monotonic() - started < 600:
                from kubernetes import client as k8s

                state = kserve.phase(k8s.CustomObjectsApi(api).get_namespaced_custom_object(  # type: ignore[arg-type]
                    kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL, model))
                if state != "pending":
                    break
                time.sleep(2)
        except Exception as exc:  # the API server's answer is the reason
            return failed(f"applying InferenceService {namespace}/{model}: {exc}")  # type: ignore[no-any-return]
        if state != "ready":
            return failed(f"InferenceService {namespace}/{model} is {state}")  # type: ignore[no-any-return]
        data = {"model": model, "version": version, "target": "kserve",
                "timings": {"ready": round(time.monotonic() - started, 3)}}
        return follow_up(event, "model.deployed", data, source=SOURCE_DEPLOY, partitionkey=model,
                         subject=f"{model}:{version}")
