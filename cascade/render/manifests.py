"""The cluster form of the platform: a kustomize base and an example overlay under ``knative/``.

``cascade render`` writes them from the same definitions ``cascade up`` runs: the functions'
func.yaml (Knative Services, Triggers on the Kafka Broker, dead-letter KafkaSinks), the image
matrix (image names) and the training and serving kinds (RBAC: each function's
ServiceAccount may touch exactly the resources it creates), plus the long-running parts a
scale-to-zero function cannot be: the job watcher (``cascade jobs watch``) and the S3
notification source (``cascade sources s3-kafka``). Every Kafka address comes from the Broker's
ConfigMap, so an overlay moves them together. A test renders again and fails when the
committed files drift; tests/cluster applies them to a real API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cascade.core import podsecurity
from cascade.functions.render import KAFKA_BOOTSTRAP, dead_letter_sink, service, trigger
from cascade.functions.spec import FunctionSpec
from cascade.functions.training.kinds import SPARK_ACCOUNT
from cascade.scheduling.frameworks import REGISTRY, VERSION
from cascade.serving.kserve import inference_service

NAMESPACE = "cascade"
BROKER = "default"
REDIS = "redis://redis.cascade.svc:6379/0"
PART_OF = {"app.kubernetes.io/part-of": "cascade"}
TRAINING_RESOURCES = {  # what launch-training and launch-finetune create (functions/training/kinds.py)
    "kubeflow.org": ["pytorchjobs", "tfjobs", "xgboostjobs", "mpijobs", "paddlejobs", "jaxjobs"],
    "batch.volcano.sh": ["jobs"], "ray.io": ["rayjobs"], "sparkoperator.k8s.io": ["sparkapplications"],
    "trainer.kubeflow.org": ["trainjobs"]}
SERVING_RESOURCES = {"serving.kserve.io": ["inferenceservices"]}
CREATES = {"launch-training": TRAINING_RESOURCES, "launch-finetune": TRAINING_RESOURCES,
           "deploy-model": SERVING_RESOURCES}
WATCHED = {group: plurals for group, plurals in TRAINING_RESOURCES.items() if group != "trainer.kubeflow.org"}
NOTIFICATIONS = "minio-notifications"  # the Kafka topic MinIO's notification target publishes to
STOPS = {"run-experiment": TRAINING_RESOURCES}  # it cancels (deletes) the trials it pruned; it creates nothing
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


def platform_env() -> list[dict[str, Any]]:
    # the Broker's ConfigMap holds the one Kafka address; $(VAR) expands an earlier variable in a pod spec
    return [{"name": "CASCADE_KAFKA_BOOTSTRAP", "valueFrom": {"configMapKeyRef": {
                "name": "kafka-broker-config", "key": "bootstrap.servers"}}},
            {"name": "CASCADE_BUS__URL", "value": "kafka://$(CASCADE_KAFKA_BOOTSTRAP)"},
            {"name": "CASCADE_STATE__URL", "value": REDIS},
            {"name": "CASCADE_TRAINING__BACKEND", "value": "kubernetes"},
            {"name": "CASCADE_TRAINING__NAMESPACE_PREFIX", "value": f"{NAMESPACE}-"},
            {"name": "CASCADE_SERVING__TARGET", "value": "kserve"},
            # the platform credential, from a Secret made once per install (docs/platform.md), never inline
            {"name": "CASCADE_PLATFORM_TOKEN", "valueFrom": {"secretKeyRef": {"name": "cascade-platform", "key": "token"}}}]


def deployment(name: str, args: list[str], account: str | None = None) -> dict[str, Any]:
    """A long-running platform process (one replica; it is not request-driven, so not a Knative Service)."""
    labels = {"app.kubernetes.io/name": name, **PART_OF}
    pod: dict[str, Any] = {"securityContext": podsecurity.pod(), "containers": [{
        "name": name.removeprefix("cascade-"), "image": f"{REGISTRY}/gateway:{VERSION}", "command": ["cascade", *args],
        "env": platform_env(), "securityContext": podsecurity.container(),
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}}]}
    if account:
        pod["serviceAccountName"] = account
    else:
        pod["automountServiceAccountToken"] = False
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta(name),
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                     "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
                     "template": {"metadata": {"labels": labels}, "spec": pod}}}


def sources() -> list[dict[str, Any]]:
    """MinIO (or any S3-compatible store) bucket notifications, from MinIO's Kafka target into the bus.

    Cascade's own consumer rather than a KafkaSource posting to ``/webhooks/s3``: that route
    authenticates every request and a KafkaSource cannot send a credential."""
    return [deployment("cascade-s3-source", ["sources", "s3-kafka", "--notifications", NOTIFICATIONS])]


def job_watch() -> list[dict[str, Any]]:
    """The job watcher: follows every project's training resources and publishes their lifecycle events."""
    rules = [{"apiGroups": [group], "resources": plurals, "verbs": ["get", "list", "watch"]}
             for group, plurals in WATCHED.items()]
    rules.append({"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]})
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("cascade-job-watch")},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta("cascade-job-watch", None),
             "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": meta("cascade-job-watch", None),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cascade-job-watch"},
             "subjects": [{"kind": "ServiceAccount", "name": "cascade-job-watch", "namespace": NAMESPACE}]},
            deployment("cascade-job-watch", ["jobs", "watch"], "cascade-job-watch")]


def gateway() -> dict[str, Any]:
    # two processes for the two CPUs of its limit (Knative adds pods beyond that)
    container = {"name": "gateway", "image": f"{REGISTRY}/gateway:{VERSION}", "ports": [{"containerPort": 8070}],
                 "env": [*platform_env(), {"name": "CASCADE_GATEWAY__WORKERS", "value": "2"}], "readinessProbe": {"httpGet": {"path": "/readyz"}},
                 "securityContext": podsecurity.container(),
                 "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}}
    annotations = {"autoscaling.knative.dev/min-scale": "1", "autoscaling.knative.dev/target": "100"}
    return {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "metadata": meta("cascade-gateway"),
            "spec": {"template": {"metadata": {"annotations": annotations},
                                  "spec": {"serviceAccountName": "cascade-gateway", "containers": [container]}}}}


def _bind(name: str, ns: str, rules: list[dict[str, Any]], account_ns: str = NAMESPACE) -> list[dict[str, Any]]:
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(name, ns), "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(name, ns),
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": account_ns}]}]


def rbac(functions: list[FunctionSpec], projects: list[str]) -> list[dict[str, Any]]:
    """A ServiceAccount per function and the gateway; a Role per project for what a function creates
    (server-side apply of a new object needs ``create`` as well as ``patch``), and per project the
    account Spark drivers run as (they create their executors)."""
    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(f"cascade-{name}")}
                                  for name in ["gateway", *sorted(f.name for f in functions)]]
    for name in sorted(f.name for f in functions if f.name in CREATES):
        rules = [{"apiGroups": [group], "resources": plurals,
                  "verbs": ["get", "list", "watch", "create", "patch", "delete"]}
                 for group, plurals in CREATES[name].items()]
        if CREATES[name] is TRAINING_RESOURCES:
            rules += [{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]
        if name == "launch-training":  # a trial's report credential, beside its pods (functions/training/kinds.py)
            rules += [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
        for proj in projects:
            docs += _bind(f"cascade-{name}", f"{NAMESPACE}-{proj}", rules)
    for name in sorted(f.name for f in functions if f.name in STOPS):
        rules = [{"apiGroups": [group], "resources": plurals, "verbs": ["get", "delete"]}
                 for group, plurals in STOPS[name].items()]
        for proj in projects:
            docs += _bind(f"cascade-{name}", f"{NAMESPACE}-{proj}", rules)
    spark = [{"apiGroups": [""], "resources": ["pods", "services", "configmaps", "persistentvolumeclaims"],
              "verbs": ["create", "get", "list", "watch", "update", "patch", "delete", "deletecollection"]}]
    for proj in projects:
        ns = f"{NAMESPACE}-{proj}"
        docs += [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(SPARK_ACCOUNT, ns)},
                 *_bind(SPARK_ACCOUNT, ns, spark, ns)]
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
        "base/sources.yaml": sources(),
        "base/job-watch.yaml": job_watch(),
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
    files["overlays/example/rbac.yaml"] = [d for d in rbac(functions, teams)
                                           if d["kind"] != "ServiceAccount" or d["metadata"]["namespace"] != NAMESPACE]
    files["overlays/example/kustomization.yaml"] = [{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../base", "projects.yaml", "rbac.yaml"],
        "images": [{"name": f"{REGISTRY}/{name}", "newTag": f"{VERSION}.0"} for name in ("gateway", "function-runtime")],
        "patches": [{"target": {"kind": "ConfigMap", "name": "kafka-broker-config"},
                     "patch": "- op: replace\n  path: /data/bootstrap.servers\n  value: kafka.example.internal:9092\n"}],
        # the pods read the ConfigMap at run time; the KafkaSinks' own field gets the same value here
        "replacements": [{"source": {"kind": "ConfigMap", "name": "kafka-broker-config",
                                     "fieldPath": "data.bootstrap\\.servers"},
                          "targets": [{"select": {"kind": "KafkaSink"}, "fieldPaths": ["spec.bootstrapServers.0"]}]}]}]
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
