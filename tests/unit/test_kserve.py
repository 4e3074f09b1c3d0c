"""InferenceService manifests, built with the kserve SDK's models, checked field by field per format."""

from __future__ import annotations

from typing import Any

import pytest
from kserve import V1beta1InferenceService

from cascade.serving.kserve import KSERVE_RUNTIMES, MODEL_FORMATS, MODEL_SERVER, inference_service, phase, storage_uri

RELEASE = {"model": "cats", "version": "3", "artifactUri": "s3://models/cats/3/model.pt", "sha256": "c" * 64,
           "canaryTrafficPercent": 10}


@pytest.mark.parametrize("fmt, kserve_format", sorted(MODEL_FORMATS.items()))
def test_inference_service_field_by_field(fmt: str, kserve_format: str) -> None:
    placement = {"limits": {"nvidia.com/gpu": "1"}, "nodeSelector": {"gpu-type": "T4"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}
    isvc = inference_service({**RELEASE, "format": fmt}, "vision", placement=placement, previous_live=True)
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    assert isvc["metadata"]["name"] == "cats" and isvc["metadata"]["namespace"] == "vision"
    assert isvc["metadata"]["annotations"] == {"serving.kserve.io/deploymentMode": "Knative",
                                               "cascade.io/sha256": "c" * 64}
    predictor = isvc["spec"]["predictor"]
    assert predictor["minReplicas"] == 0 and predictor["canaryTrafficPercent"] == 10
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("concurrency", 10)
    resources = {"limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "1", "memory": "2Gi"}}
    assert storage_uri(isvc) == "s3://models/cats/3/model.pt"
    if fmt in KSERVE_RUNTIMES:  # KServe's own runtime loads Cascade's one-file artifact
        assert predictor["model"]["modelFormat"] == {"name": kserve_format}
        assert predictor["model"]["storageUri"] == "s3://models/cats/3/model.pt"
        assert predictor["model"]["resources"] == resources and "containers" not in predictor
    else:  # Cascade's model server as a custom predictor, fed by KServe's storage initializer
        [c] = predictor["containers"]
        assert "model" not in predictor and c["name"] == "kserve-container" and c["image"] == MODEL_SERVER
        assert c["args"] == ["--name", "cats", "--artifact", "/mnt/models", "--format", fmt]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["STORAGE_URI"] == "s3://models/cats/3/model.pt" and env["CASCADE_MODEL_HOST"] == "0.0.0.0"
        assert c["resources"] == resources and c["ports"] == [{"containerPort": 8080, "protocol": "TCP"}]
    assert predictor["nodeSelector"] == {"gpu-type": "T4"} and predictor["tolerations"] == placement["tolerations"]
    assert V1beta1InferenceService(**{"api_version": isvc["apiVersion"], "kind": isvc["kind"],
                                      "metadata": isvc["metadata"], "spec": isvc["spec"]}).kind == "InferenceService"


def test_no_canary_without_a_live_version() -> None:
    isvc = inference_service({**RELEASE, "format": "sklearn"}, "vision")
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]
    assert "nodeSelector" not in isvc["spec"]["predictor"]


@pytest.mark.parametrize("status, expected", [
    ({"conditions": [{"type": "Ready", "status": "True"}]}, "ready"),
    ({"conditions": [{"type": "Ready", "status": "False", "reason": "RevisionFailed"}]}, "failed"),
    ({"conditions": [{"type": "Ready", "status": "Unknown"}]}, "pending"),
    ({}, "pending"),
    ({"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}, "pending"),  # generation 2 unseen
])
def test_phase(status: dict[str, Any], expected: str) -> None:
    assert phase({"metadata": {"generation": 2}, "status": status}) == expected
