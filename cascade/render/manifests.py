"""The cluster form of the platform: a kustomize base and an example overlay under ``knative/``.

``cascade render`` writes them from the same definitions ``cascade up`` runs: the functions'
func.yaml (Knative Services, Triggers on the Kafka Broker, dead-letter KafkaSinks), the image
matrix (image names) and the training and serving kinds (RBAC: each function's
ServiceAccount may touch exactly the resources it creates). A test renders again and fails
when the committed files drift.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cascade.core import podsecurity
from cascade.functions.render import KAFKA_BOOTSTRAP, dead_letter_sink, service, trigger
from cascade.functions.spec import FunctionSpec
from cascade.scheduling.frameworks import REGISTRY, VERSION
from cascade.serving.kserve import inference_service

NAMESPACE = "cascade"
BROKER = "default"
REDIS = "redis://redis.cascade.svc:6379/0"
PART_OF = {"app.kubernetes.io/part-of": "cascade"}
TRAINING_RESOURCES = {  # what launch-training and launch-finetune create (functions/training/kinds.py)
    "kubeflow.org": ["pytorchjobs", "tfjobs", "xgboostjobs", "mpijobs", "paddlejobs", "jaxjobs", "mxjobs"],
    "batch.volcano.sh": ["jobs"], "ray.io": ["rayjobs"], "sparkoperator.k8s.io": ["sparkapplications"],
    "trainer.kubeflow.org": ["trainjobs"]}
SERVING_RESOURCES = {"serving.kserve.io": ["inferenceservices"]}
CREATES = {"launch-training": TRAINING_RESOURCES, "launch-finetune": TRAINING_RESOURCES,
           "deploy-model": SERVING_RESOURCES}
QUOTA = {"requests.cpu": "64", "requests.memory": "256Gi", "requests.nvidia.com/gpu": "8",
         "requests.huawei.com/Ascend910": "8", "count/pytorchjobs.kubeflow.org": "20",
         "count/inferenceservices.serving.kserve.io": "20"}


def meta(name: str, namespace: str | None = NAMESPACE, **extra: Any) -> dict[str, Any]:
    return {"name": name, **({"namespace": namespace} if namespace else {}), "labels": dict(PART_OF), **extra}


def project(name: str, quota: dict[str, str]) -> list[dict[str, Any]]:
    """A project's namespace (where its jobs and models run) and its ResourceQuota."""
    ns = f"{NAMESPACE}-{name}"
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": meta(ns, None, annotations={"cascade.io/project": name})},
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": meta("cascade-quota", ns), "spec": {"hard": quota}}]


def broker() -> list[dict[str, Any]]:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("kafka-broker-config"),
              "data": {"default.topic.partitions": "4", "default.topic.replication.factor": "3",
                       "bootstrap.servers": KAFKA_BOOTSTRAP}}
    return [config, {"apiVersion": "eventing.knative.dev/v1", "kind": "Broker",
                     "metadata": meta(BROKER, annotations={"eventing.knative.dev/broker.class": "Kafka"}),
                     "spec": {"config": {"apiVersion": "v1", "kind": "ConfigMap", "name": "kafka-broker-config",
                                         "namespace": NAMESPACE},
                              "delivery": {"retry": 10, "backoffPolicy": "exponential", "backoffDelay": "PT0.2S"}}}]


def kafka_source() -> dict[str, Any]:
    """MinIO (or any S3-compatible store) bucket notifications on a Kafka topic, into the gateway."""
    return {"apiVersion": "sources.knative.dev/v1", "kind": "KafkaSource", "metadata": meta("minio-notifications"),
            "spec": {"consumerGroup": "cascade-minio-notifications", "bootstrapServers": [KAFKA_BOOTSTRAP],
                     "topics": ["minio-notifications"], "initialOffset": "earliest",
                     "sink": {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                                      "name": "cascade-gateway"}, "uri": "/webhooks/s3"}}}


def platform_env() -> list[dict[str, Any]]:
    return [{"name": "CASCADE_BUS__URL", "value": f"kafka://{KAFKA_BOOTSTRAP}"},
            {"name": "CASCADE_STATE__URL", "value": REDIS},
            {"name": "CASCADE_TRAINING__BACKEND", "value": "kubernetes"},
            {"name": "CASCADE_TRAINING__NAMESPACE_PREFIX", "value": f"{NAMESPACE}-"},
            {"name": "CASCADE_SERVING__TARGET", "value": "kserve"},
            # the platform credential, from a Secret made once per install (docs/platform.md), never inline
            {"name": "CASCADE_PLATFORM_TOKEN", "valueFrom": {"secretKeyRef": {"name": "cascade-platform", "key": "token"}}}]


def gateway() -> dict[str, Any]:
    container = {"name": "gateway", "image": f"{REGISTRY}/gateway:{VERSION}", "ports": [{"containerPort": 8070}],
                 "env": platform_env(), "readinessProbe": {"httpGet": {"path": "/readyz"}},
                 "securityContext": podsecurity.container(),
                 "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}
    annotations = {"autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/target": "100"}
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": meta("cascade-gateway"),
            "spec": {"template": {"metadata": {"annotations": annotations},
                                  "spec": {"serviceAccountName": "cascade-gateway", "containers": [container]}}}}


def rbac(functions: list[FunctionSpec], projects: list[str]) -> list[dict[str, Any]]:
    """A ServiceAccount per function and the gateway; a Role per project for what a function creates."""
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(f"cascade-{name}")}
                                  for name in ["gateway", *sorted(f.name for f in functions)]]
    for name in sorted(f.name for f in functions if f.name in CREATES):
        rules = [{"apiGroups": [group], "resources": plurals, "verbs": ["get", "list", "watch", "patch", "delete"]}
                 for group, plurals in CREATES[name].items()]
        if CREATES[name] is TRAINING_RESOURCES:
            rules += [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]
        for proj in projects:
            ns = f"{NAMESPACE}-{proj}"
            docs += [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(f"cascade-{name}", ns),
                      "rules": rules},
                     {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                      "metadata": meta(f"cascade-{name}", ns),
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"cascade-{name}"},
                      "subjects": [{"kind": "ServiceAccount", "name": f"cascade-{name}", "namespace": NAMESPACE}]}]
    return docs


def function_documents(spec: FunctionSpec) -> list[dict[str, Any]]:
    svc = service(spec, NAMESPACE)
    pod = svc["spec"]["template"]["spec"]
    pod["serviceAccountName"] = f"cascade-{spec.name}"
    pod["containers"][0]["env"] = platform_env() + pod["containers"][0]["env"]
    return [svc] + [d for t in spec.trigger_models() for d in (trigger(t, NAMESPACE), dead_letter_sink(t, NAMESPACE))]


def inference_template() -> dict[str, Any]:
    """What deploy-model applies for a release (serving/kserve.py), with placeholder values."""
    release = {"model": "example-model", "version": "1", "format": "torchscript", "sha256": "0" * 64,
               "artifactUri": "s3://models/example-model/1/"}
    return inference_service(release, f"{NAMESPACE}-default")


def tree(functions: list[FunctionSpec]) -> dict[str, list[dict[str, Any]]]:
    """Relative path -> documents, for every file under ``knative/``."""
    functions = sorted(functions, key=lambda f: f.name)
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": meta(NAMESPACE, None)}
    files: dict[str, list[dict[str, Any]]] = {
        "base/namespace.yaml": [namespace, *project("default", QUOTA)],
        "base/broker.yaml": broker(),
        "base/sources.yaml": [kafka_source()],
        "base/gateway.yaml": [gateway()],
        "base/rbac.yaml": rbac(functions, ["default"]),
        **{f"base/functions/{f.name}.yaml": function_documents(f) for f in functions},
        "base/templates/inferenceservice.yaml": [inference_template()],
    }
    resources = [p.removeprefix("base/") for p in files if not p.startswith("base/templates/")]
    files["base/kustomization.yaml"] = [{"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                                         "resources": resources, "labels": [{"pairs": {"app.kubernetes.io/version": VERSION}}]}]
    teams = ["vision", "nlp"]
    files["overlays/example/projects.yaml"] = [d for team in teams for d in project(team, {**QUOTA, "requests.nvidia.com/gpu": "16"})]
    files["overlays/example/rbac.yaml"] = [d for d in rbac(functions, teams) if d["kind"] != "ServiceAccount"]
    files["overlays/example/kustomization.yaml"] = [{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../base", "projects.yaml", "rbac.yaml"],
        "images": [{"name": f"{REGISTRY}/{name}", "newTag": f"{VERSION}.0"} for name in ("gateway", "function-runtime")],
        "patches": [{"target": {"kind": "ConfigMap", "name": "kafka-broker-config"},
                     "patch": "- op: replace\n  path: /data/bootstrap.servers\n  value: kafka.example.internal:9092\n"}]}]
    return files


def render(functions: list[FunctionSpec], out: Path) -> dict[Path, str]:
    """The text of every file under ``out`` (nothing written; see ``write``)."""
    texts = {}
    for rel, docs in tree(functions).items():
        header = "# Rendered by `cascade render` from the functions, the image matrix and the kinds; do not edit.\n"
        texts[out / rel] = header + yaml.safe_dump_all(docs, sort_keys=False)
    return texts


def _present(folders: list[Path]) -> set[Path]:
    return {p for folder in folders for p in folder.rglob("*") if p.is_file() and p.name != "README.md"}


def stale(texts: dict[Path, str], folders: list[Path]) -> list[Path]:
    """Files under ``folders`` that differ from ``texts``, are missing, or are no longer rendered."""
    return sorted(p for p in _present(folders) | set(texts) if texts.get(p) != (p.read_text() if p.exists() else None))


def write(texts: dict[Path, str], folders: list[Path]) -> list[Path]:
    """Write the files and remove the ones no longer rendered; returns what changed."""
    changed = stale(texts, folders)
    for path in changed:
        if path in texts:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(texts[path])
        else:
            path.unlink()
    return changed
