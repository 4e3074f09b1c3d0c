"""The cluster form: knative/ manifests and images/ Dockerfiles are what `cascade render` makes.

Drift fails the build; every document parses and carries the fields its kind needs; names
that refer to each other resolve (trigger subscribers, dead-letter sinks, service accounts);
RBAC covers every resource a function creates; every (framework, vendor) pair of the matrix
has a Dockerfile whose FROM the matrix builds or is a public base.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cascade.functions.platform import PLATFORM_FUNCTIONS
from cascade.functions.spec import discover
from cascade.functions.training import kinds
from cascade.render import images, manifests
from cascade.scheduling.frameworks import MATRIX, image, pairs
from tests.unit.test_training_kinds import placed

ROOT = Path(__file__).resolve().parents[2]
REQUIRED: dict[str, list[str]] = {  # kind -> dotted paths that must be present
    "Namespace": [], "ServiceAccount": [], "ResourceQuota": ["spec.hard"], "ConfigMap": ["data"],
    "Broker": ["spec.config.name", "metadata.annotations.eventing.knative.dev/broker.class"],
    "Trigger": ["spec.broker", "spec.subscriber", "spec.delivery.deadLetterSink.ref.name"],
    "KafkaSink": ["spec.topic", "spec.bootstrapServers"],
    "Deployment": ["spec.template.spec.containers", "spec.selector.matchLabels"],
    "ClusterRole": ["rules"], "ClusterRoleBinding": ["roleRef.name", "subjects"],
    "Service": ["spec.template.spec.containers", "spec.template.spec.serviceAccountName"],
    "Role": ["rules"], "RoleBinding": ["roleRef.name", "subjects"],
    "InferenceService": ["spec.predictor.containers", "spec.predictor.minReplicas"],
}


def rendered() -> dict[Path, str]:
    return {**manifests.render(discover([PLATFORM_FUNCTIONS]), ROOT / "knative"), **images.render(ROOT / "images")}


def get(doc: dict[str, Any], path: str) -> Any:
    node: Any = doc
    head, _, key = path.partition("annotations.")
    parts = [*head.strip(".").split("."), "annotations", key] if key else path.split(".")  # keys keep their dots
    for part in parts:
        assert isinstance(node, dict) and part in node, f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}: {path}"
        node = node[part]
    return node


def documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, d) for p in sorted((ROOT / "knative").rglob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def test_committed_files_are_what_cascade_render_makes() -> None:
    stale = manifests.stale(rendered(), [ROOT / "knative", ROOT / "images"])
    assert not stale, f"run `cascade render`: {[str(p.relative_to(ROOT)) for p in stale]}"


def test_every_document_has_the_fields_of_its_kind() -> None:
    docs = documents()
    assert {d["kind"] for _, d in docs} >= set(REQUIRED) | {"Kustomization"}
    for path, doc in docs:
        if doc["kind"] == "Kustomization":
            for resource in doc["resources"]:
                assert (path.parent / resource).exists(), f"{path}: {resource}"
            continue
        assert doc["apiVersion"] and get(doc, "metadata.name"), path
        for field in REQUIRED[doc["kind"]]:
            assert get(doc, field) not in (None, "", [], {}), f"{path}: {doc['kind']} needs {field}"


def test_names_resolve_and_functions_run_as_their_own_accounts() -> None:
    docs = [d for _, d in documents()]
    named = {(d["kind"], d["metadata"]["name"]) for d in docs if "metadata" in d}
    broker = next(d for d in docs if d["kind"] == "Broker")
    assert broker["metadata"]["annotations"]["eventing.knative.dev/broker.class"] == "Kafka"
    for t in (d for d in docs if d["kind"] == "Trigger"):
        assert t["spec"]["broker"] == broker["metadata"]["name"]
        assert ("Service", t["spec"]["subscriber"]["ref"]["name"]) in named
        assert ("KafkaSink", t["spec"]["delivery"]["deadLetterSink"]["ref"]["name"]) in named
    for s in (d for d in docs if d["kind"] == "Service"):
        assert ("ServiceAccount", s["spec"]["template"]["spec"]["serviceAccountName"]) in named
    for b in (d for d in docs if d["kind"] == "RoleBinding"):
        assert ("Role", b["roleRef"]["name"]) in named and ("ServiceAccount", b["subjects"][0]["name"]) in named
    quotas = [d for d in docs if d["kind"] == "ResourceQuota"]
    assert {q["metadata"]["namespace"] for q in quotas} == {"cascade-default", "cascade-vision", "cascade-nlp"}


def allowed(role: dict[str, Any]) -> set[tuple[str, str]]:
    return {(g, r) for rule in role["rules"] if "patch" in rule["verbs"] for g in rule["apiGroups"] for r in rule["resources"]}


def test_rbac_lets_each_function_create_exactly_what_it_creates() -> None:
    roles = {d["metadata"]["name"]: d for _, d in documents()
             if d["kind"] == "Role" and d["metadata"]["namespace"] == "cascade-default"}
    made = set()
    for framework in (f for f, vendors in MATRIX.items() if "nvidia" in vendors and f not in kinds.REFUSED):
        resource = kinds.render(placed(framework), "cascade-default")
        made.add((resource["apiVersion"].split("/")[0], kinds.plural(resource["kind"])))
    assert made <= allowed(roles["cascade-launch-training"])
    assert allowed(roles["cascade-deploy-model"]) == {("serving.kserve.io", "inferenceservices")}
    assert "cascade-release-model" not in roles  # it only reads and writes events and the registry


def test_the_inference_service_template_scales_to_zero_on_knative() -> None:
    [isvc] = [d for _, d in documents() if d["kind"] == "InferenceService"]
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Knative"
    assert isvc["spec"]["predictor"]["minReplicas"] == 0


def test_every_matrix_pair_has_a_dockerfile_built_on_an_image_the_matrix_builds() -> None:
    matrix = yaml.safe_load((ROOT / "images" / "matrix.yaml").read_text())
    built = {e["image"] for group in ("bases", "frameworks", "runtimes") for e in matrix[group]}
    assert {(e["framework"], e["vendor"]) for e in matrix["frameworks"]} == set(pairs())
    for entry in matrix["frameworks"]:
        assert entry["image"] == image(entry["framework"], entry["vendor"])  # what the matcher picks
    bases = {e["image"] for e in matrix["bases"]}
    for group in ("bases", "frameworks", "runtimes"):
        for entry in matrix[group]:
            dockerfile = (ROOT / "images" / entry["dockerfile"]).read_text()
            [parent] = re.findall(r"^FROM (\S+)", dockerfile, re.M)
            assert parent == entry["from"]
            assert parent in built or parent in matrix["public"], f"{entry['dockerfile']}: FROM {parent}"
            if group != "bases":
                assert parent in bases  # layered: frameworks and runtimes start from a base the matrix builds


@pytest.mark.parametrize("runtime", ["gateway", "dispatcher", "function-runtime", "model-server"])
def test_runtime_images_exist_for_every_platform_process(runtime: str) -> None:
    assert (ROOT / "images" / "runtime" / f"{runtime}.Dockerfile").exists()
