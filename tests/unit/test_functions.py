"""Function definitions: func.yaml loading and the Knative manifests rendered from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cascade.core.errors import InvalidInput
from cascade.functions.render import documents
from cascade.functions.spec import discover, load_function

FUNC = """name: resize
module: handler
triggers:
- name: resize-on-upload
  filters:
  - exact: {type: io.cascade.dataset.uploaded.v1}
  - data: "data.size > 1024"
  ordering: ordered
  delivery: {retry: 3, backoffPolicy: linear, backoffDelay: PT0.5S, timeout: PT10S}
- name: resize-hook
  subscriber: https://hooks.example.invalid/resize
annotations:
  autoscaling.knative.dev/min-scale: 0
  autoscaling.knative.dev/max-scale: "5"
  autoscaling.knative.dev/target: "20"
containerConcurrency: 4
resources: {accelerator: "1(V100)", cpu: "2", memory: 4Gi}
env: {LOG_LEVEL: debug}
secrets: [hf-token]
"""


@pytest.fixture
def fn(tmp_path: Path) -> Path:
    (tmp_path / "resize").mkdir()
    (tmp_path / "resize" / "func.yaml").write_text(FUNC)
    (tmp_path / "resize" / "handler.py").write_text("def handle(event):\n    return None\n")
    return tmp_path / "resize"


def test_func_yaml_loads_with_its_triggers(fn: Path) -> None:
    spec = load_function(fn)
    assert spec.name == "resize" and spec.container_concurrency == 4 and spec.annotations[
        "autoscaling.knative.dev/min-scale"] == "0"
    triggers = spec.trigger_models()
    assert [t.subscriber for t in triggers] == ["resize", "https://hooks.example.invalid/resize"]
    assert [s.name for s in discover([fn.parent])] == ["resize"]


def test_func_yaml_errors_name_the_file_and_field(fn: Path) -> None:
    (fn / "func.yaml").write_text(FUNC.replace("containerConcurrency: 4", "containerConcurrency: -1"))
    with pytest.raises(InvalidInput, match="func.yaml: containerConcurrency"):
        load_function(fn)
    (fn / "func.yaml").write_text(FUNC.replace("module: handler", "module: missing"))
    with pytest.raises(InvalidInput, match="module 'missing' not found"):
        load_function(fn)


def test_knative_service_field_by_field(fn: Path) -> None:
    svc = documents(load_function(fn), namespace="vision", image="registry.local/resize:1")[0]
    assert (svc["apiVersion"], svc["kind"]) == ("serving.knative.dev/v1", "Service")
    assert svc["metadata"] == {"name": "resize", "namespace": "vision",
                               "labels": {"app.kubernetes.io/part-of": "cascade", "cascade.io/function": "resize",
                                          "networking.knative.dev/visibility": "cluster-local"}}
    template = svc["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "autoscaling.knative.dev/class": "kpa.autoscaling.knative.dev", "autoscaling.knative.dev/min-scale": "0",
        "autoscaling.knative.dev/max-scale": "5", "autoscaling.knative.dev/target": "20",
        "cascade.io/accelerator": "1(V100)"}
    assert template["spec"]["containerConcurrency"] == 4
    [container] = template["spec"]["containers"]
    assert container["image"] == "registry.local/resize:1"
    assert container["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                             "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["resources"] == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    env = {e["name"]: e for e in container["env"]}
    assert env["LOG_LEVEL"] == {"name": "LOG_LEVEL", "value": "debug"}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "value"}}
    assert env["CASCADE_DATA_FILTER"]["value"] == "(data.size > 1024)"


def test_knative_triggers_field_by_field(fn: Path) -> None:
    docs = documents(load_function(fn), namespace="vision")
    triggers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Trigger"}
    t = triggers["resize-on-upload"]
    assert t["apiVersion"] == "eventing.knative.dev/v1"
    assert t["metadata"]["annotations"] == {"kafka.eventing.knative.dev/delivery.order": "ordered"}
    assert t["spec"]["broker"] == "default"
    assert t["spec"]["filters"] == [{"exact": {"type": "io.cascade.dataset.uploaded.v1"}}], "data filters cannot go here"
    assert t["spec"]["subscriber"] == {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "resize"}}
    assert t["spec"]["delivery"] == {"retry": 3, "backoffPolicy": "linear", "backoffDelay": "PT0.5S", "timeout": "PT10S",
                                     "deadLetterSink": {"ref": {"apiVersion": "eventing.knative.dev/v1alpha1",
                                                                "kind": "KafkaSink", "name": "resize-on-upload-dlq"}}}
    hook = triggers["resize-hook"]
    assert hook["spec"]["subscriber"] == {"uri": "https://hooks.example.invalid/resize"}
    assert hook["metadata"]["annotations"]["kafka.eventing.knative.dev/delivery.order"] == "unordered"
    assert "filters" not in hook["spec"]
    sinks = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KafkaSink"}
    assert sinks["resize-on-upload-dlq"]["spec"]["topic"] == "cascade.dlq.resize-on-upload"


def test_rendered_documents_survive_a_yaml_round_trip(fn: Path) -> None:
    docs = list(yaml.safe_load_all(yaml.safe_dump_all(documents(load_function(fn)))))
    assert [d["kind"] for d in docs] == ["Service", "Trigger", "KafkaSink", "Trigger", "KafkaSink"]
