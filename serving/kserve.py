"""KServe InferenceServices for released models, built with the ``kserve`` SDK's models.

``serving.kserve.io/deploymentMode: Knative`` with ``minReplicas: 0`` (the default mode since
0.16, Standard, cannot reach zero without KEDA); ``modelFormat`` and ``storageUri`` from the
release; resources and placement from the accelerator matcher; ``canaryTrafficPercent`` when
a previous version is live; ``phase`` reads its Ready condition. Pure functions: applying it
is the KServe deploy target's job (``cascade.serving.targets.kserve``).
"""

from __future__ import annotations

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

# Registry formats -> KServe modelFormat names (what the serving runtimes declare).
MODEL_FORMATS = {"torchscript": "pytorch", "pytorch": "pytorch", "pytorch-export": "pytorch", "sklearn": "sklearn", "xgboost": "xgboost",
                 "onnx": "onnx", "tensorflow": "tensorflow", "huggingface": "huggingface",
                 "lora-adapter": "huggingface"}
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"


def inference_service(release: dict[str, Any], namespace: str, *, placement: dict[str, Any] | None = None,
                      previous_live: bool = False, previous_version: str | None = None, cpu: str = "1",
                      memory: str = "2Gi", scale_target: int = 10) -> dict[str, Any]:
    """The InferenceService for a ``model.released`` event's data, as a plain dict.

    ``previous_version``: the version live now (recorded in an annotation, so the split a canary
    makes can be read back from the object); it implies ``previous_live``.
    """
    previous_live = previous_live or previous_version is not None
    p = placement or {}
    limits = {"cpu": cpu, "memory": memory, **p.get("limits", {})}
    model = V1beta1ModelSpec(name="kserve-container", model_format=V1beta1ModelFormat(name=MODEL_FORMATS[release["format"]]),
                             storage_uri=release["artifactUri"],
                             resources={"limits": limits, "requests": {"cpu": cpu, "memory": memory}},
                             security_context=podsecurity.container())
    canary = release.get("canaryTrafficPercent") if previous_live else None
    predictor = V1beta1PredictorSpec(model=model, min_replicas=0, scale_target=scale_target,
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
    """'ready', 'failed' (with a reason in the condition) or 'pending'."""
    for condition in (resource.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return "ready"
            if condition.get("reason") in ("RevisionFailed", "InvalidSpec", "ModelLoadFailed"):
                return "failed"
    return "pending"
