"""KServe InferenceServices for released models, built with the ``kserve`` SDK's models.

``serving.kserve.io/deploymentMode: Knative`` with ``minReplicas: 0`` (the default mode since
0.16, Standard, cannot reach zero without KEDA); resources and placement from the accelerator
matcher; ``canaryTrafficPercent`` when a previous version is live; ``phase`` reads its Ready
condition. sklearn and xgboost artifacts (one ``model.joblib`` / ``model.bst`` file) go to
KServe's own runtimes through ``modelFormat`` + ``storageUri``; every other format (TorchScript,
state dicts, torch.export, ONNX, Hugging Face and LoRA folders) to Cascade's model-server image
as a custom predictor, which reads the artifact where KServe's storage initializer puts it
(``STORAGE_URI`` -> ``/mnt/models``) and serves it exactly as ``cascade up`` does. Pure
functions: applying it is the KServe deploy target's job (``cascade.serving.targets.kserve``).
"""

from __future__ import annotations

import json
from typing import Any, cast

from kserve import (
    V1beta1InferenceService,
    V1beta1InferenceServiceSpec,
    V1beta1ModelFormat,
    V1beta1ModelSpec,
    V1beta1PredictorSpec,
)
from kserve.api_client import ApiClient as KServeApiClient

from cascade.core import podsecurity
from cascade.scheduling.frameworks import REGISTRY
from cascade.scheduling.frameworks import VERSION as IMAGE_VERSION

# Registry formats -> KServe modelFormat names (what the serving runtimes declare).
MODEL_FORMATS = {"torchscript": "pytorch", "pytorch": "pytorch", "pytorch-export": "pytorch", "sklearn": "sklearn", "xgboost": "xgboost",
                 "onnx": "onnx", "tensorflow": "tensorflow", "huggingface": "huggingface",
                 "lora-adapter": "huggingface"}
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
KSERVE_RUNTIMES = ("sklearn", "xgboost")  # KServe's sklearnserver / xgbserver load Cascade's one-file artifact as is
MODEL_SERVER = f"{REGISTRY}/model-server:{IMAGE_VERSION}"  # images/runtime/model-server.Dockerfile


def inference_service(release: dict[str, Any], namespace: str, *, placement: dict[str, Any] | None = None,
                      previous_live: bool = False, previous_version: str | None = None, cpu: str = "1",
                      memory: str = "2Gi", scale_target: int = 10, image: str | None = None) -> dict[str, Any]:
    """The InferenceService for a ``model.released`` event's data, as a plain dict.

    ``previous_version``: the version live now (recorded in an annotation, so the split a canary
    makes can be read back from the object); it implies ``previous_live``.
    """
    previous_live = previous_live or previous_version is not None
    p = placement or {}
    limits = {"cpu": cpu, "memory": memory, **p.get("limits", {})}
    resources = {"limits": limits, "requests": {"cpu": cpu, "memory": memory}}
    model: V1beta1ModelSpec | None = None
    containers = None
    if release["format"] in KSERVE_RUNTIMES:
        model = V1beta1ModelSpec(name="kserve-container", model_format=V1beta1ModelFormat(name=MODEL_FORMATS[release["format"]]),
                                 storage_uri=release["artifactUri"], resources=resources,
                                 security_context=podsecurity.container())
    else:
        containers = [model_server(release, resources, image)]
    canary = release.get("canaryTrafficPercent") if previous_live else None
    predictor = V1beta1PredictorSpec(model=model, containers=containers, min_replicas=0, scale_target=scale_target,
                                     scale_metric="concurrency", container_concurrency=0,
                                     canary_traffic_percent=canary, node_selector=p.get("nodeSelector") or None,
                                     tolerations=list(p.get("tolerations", [])) or None)
    isvc = V1beta1InferenceService(
        api_version=f"{GROUP}/{VERSION}", kind="InferenceService",
        metadata={"name": release["model"], "namespace": namespace,
                  "labels": {"app.kubernetes.io/part-of": "cascade", "cascade.io/model": release["model"],
                             "cascade.io/version": str(release["version"])},
                  "annotations": {"serving.kserve.io/deploymentMode": "Knative", "cascade.io/sha256": release["sha256"],
                                  **({"cascade.io/previous-version": previous_version}
                                     if previous_version and canary is not None else {})}},
        spec=V1beta1InferenceServiceSpec(predictor=predictor))
    return cast(dict[str, Any], KServeApiClient().sanitize_for_serialization(isvc))


def model_server(release: dict[str, Any], resources: dict[str, Any], image: str | None = None) -> dict[str, Any]:
    """Cascade's model-server container for a release, reading the artifact from ``/mnt/models`` (where KServe's
    storage initializer puts ``STORAGE_URI``)."""
    env = {"STORAGE_URI": release["artifactUri"], "PORT": "8080", "CASCADE_MODEL_HOST": "0.0.0.0",
           "CASCADE_MODEL_VERSION": str(release["version"])}
    if release.get("signature"):
        env["CASCADE_MODEL_SIGNATURE"] = json.dumps(release["signature"], sort_keys=True)
    return {"name": "kserve-container", "image": image or MODEL_SERVER,
            "command": ["python", "-m", "cascade.serving.modelserver"],
            "args": ["--name", release["model"], "--artifact", "/mnt/models", "--format", release["format"]],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "ports": [{"containerPort": 8080, "protocol": "TCP"}], "resources": resources,
            "securityContext": podsecurity.container()}


def storage_uri(resource: dict[str, Any]) -> str:
    """Where the InferenceService's artifact comes from (a runtime's ``storageUri`` or the custom container's env)."""
    predictor = (resource.get("spec") or {}).get("predictor") or {}
    if (predictor.get("model") or {}).get("storageUri"):
        return str(predictor["model"]["storageUri"])
    env = [e for c in predictor.get("containers") or [] for e in c.get("env") or [] if e.get("name") == "STORAGE_URI"]
    return str(env[0]["value"]) if env else ""


def traffic(resource: dict[str, Any]) -> dict[str, int]:
    """The versions a ready InferenceService sends traffic to, with their percent."""
    if phase(resource) != "ready":
        return {}
    meta = resource.get("metadata") or {}
    version = str((meta.get("labels") or {}).get("cascade.io/version", ""))
    previous = (meta.get("annotations") or {}).get("cascade.io/previous-version")
    canary = ((resource.get("spec") or {}).get("predictor") or {}).get("canaryTrafficPercent")
    if previous and canary is not None and int(canary) == 0:
        return {str(previous): 100}  # the canary rolled back: the previous revision takes everything
    if previous and canary is not None and int(canary) < 100:
        return {str(previous): 100 - int(canary), version: int(canary)}
    return {version: 100}


def withdrawn(resource: dict[str, Any], version: str) -> dict[str, Any]:
    """``resource`` (a live split of two versions) as applied again without ``version``: the canary withdrawn is
    ``canaryTrafficPercent: 0``; the previous one withdrawn leaves the canary all the traffic."""
    meta = resource.get("metadata") or {}
    out = {"apiVersion": resource.get("apiVersion", f"{GROUP}/{VERSION}"), "kind": "InferenceService",
           "metadata": {k: meta[k] for k in ("name", "namespace", "labels") if k in meta},
           "spec": {**resource.get("spec", {}), "predictor": dict((resource.get("spec") or {}).get("predictor") or {})}}
    annotations = dict(meta.get("annotations") or {})
    if str((meta.get("labels") or {}).get("cascade.io/version", "")) == version:
        out["spec"]["predictor"]["canaryTrafficPercent"] = 0
    else:
        out["spec"]["predictor"].pop("canaryTrafficPercent", None)
        annotations.pop("cascade.io/previous-version", None)
    out["metadata"]["annotations"] = annotations
    return out


def phase(resource: dict[str, Any]) -> str:
    """'ready', 'failed' (with a reason in the condition) or 'pending'. A status written for an older
    generation of the spec (``observedGeneration``) is pending: the controller has not seen the change."""
    status = resource.get("status") or {}
    observed = status.get("observedGeneration")
    if observed is not None and int(observed) < int((resource.get("metadata") or {}).get("generation") or 0):
        return "pending"
    for condition in (resource.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return "ready"
            if condition.get("reason") in ("RevisionFailed", "InvalidSpec", "ModelLoadFailed"):
                return "failed"
    return "pending"


def failure(resource: dict[str, Any]) -> str:
    """What the Ready condition says, for a failed InferenceService."""
    for condition in (resource.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready" and condition.get("status") != "True":
            return ": ".join(str(condition[k]) for k in ("reason", "message") if condition.get(k))
    return ""
