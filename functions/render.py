"""Render functions as Knative resources, so one func.yaml runs locally and on a cluster.

Per function: a ``serving.knative.dev/v1`` Service with the same autoscaling annotations,
``containerConcurrency``, resources and env (secrets as ``secretKeyRef``), and per trigger an
``eventing.knative.dev/v1`` Trigger on the Kafka broker with the same filters, delivery spec
and ``kafka.eventing.knative.dev/delivery.order``; dead letters go to a KafkaSink on the
trigger's dead-letter topic. Knative cannot filter on ``data`` (eventing #8274): such a
filter is dropped from the Trigger and passed to the function as ``CASCADE_DATA_FILTER``,
which the runtime applies before the handler.
"""

from __future__ import annotations

from typing import Any

from cascade.core import podsecurity
from cascade.core.secrets import secret_refs
from cascade.events.triggers import Trigger
from cascade.functions.spec import FunctionSpec
from cascade.scheduling.frameworks import REGISTRY, VERSION

DEFAULT_IMAGE = f"{REGISTRY}/function-runtime:{VERSION}"  # built by images/runtime/function-runtime.Dockerfile
KAFKA_BOOTSTRAP = "my-cluster-kafka-bootstrap.kafka:9092"


def _knative_filters(filters: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Split filters into what Knative evaluates and the data expressions it cannot."""
    kept, data = [], []
    for f in filters:
        if "data" in f:
            data.append(str(f["data"]))
        else:
            kept.append(f)
    return kept, data


def service(spec: FunctionSpec, namespace: str, image: str | None = None) -> dict[str, Any]:
    env: list[dict[str, Any]] = [{"name": k, "value": str(v)} for k, v in sorted(spec.env.items())]
    env += [{"name": "CASCADE_FUNCTION", "value": spec.name}, {"name": "CASCADE_FUNCTION_MODULE", "value": spec.module}]
    data_filters = [d for t in spec.trigger_models() for d in _knative_filters(t.filters)[1]]
    if data_filters:
        env.append({"name": "CASCADE_DATA_FILTER", "value": " or ".join(f"({d})" for d in data_filters)})
    env += secret_refs(spec.secrets)
    annotations = {"autoscaling.knative.dev/class": "kpa.autoscaling.knative.dev", **spec.annotations}
    if spec.resources.accelerator not in ("", "0"):
        annotations["cascade.io/accelerator"] = spec.resources.accelerator
    resources = {"cpu": spec.resources.cpu, "memory": spec.resources.memory}
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "cascade", "cascade.io/function": spec.name,
                                # reachable only inside the cluster: the broker delivers here without credentials
                                "networking.knative.dev/visibility": "cluster-local"}},
        "spec": {"template": {
            "metadata": {"annotations": annotations, "labels": {"cascade.io/function": spec.name}},
            "spec": {"containerConcurrency": spec.container_concurrency, "containers": [{
                "name": "function", "image": image or spec.image or DEFAULT_IMAGE,
                "ports": [{"containerPort": 8080}], "env": env,
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                "securityContext": podsecurity.container(),
                "readinessProbe": {"httpGet": {"path": "/healthz"}}}]}}},
    }


def trigger(t: Trigger, namespace: str) -> dict[str, Any]:
    filters, _ = _knative_filters(t.filters)
    if t.filter and t.filter.get("attributes"):
        filters.append({"exact": dict(t.filter["attributes"])})
    subscriber: dict[str, Any] = {"uri": t.subscriber} if t.is_url else {
        "ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": t.subscriber}}
    d = t.delivery
    spec: dict[str, Any] = {"broker": t.broker, "subscriber": subscriber, "delivery": {
        "retry": d.retry, "backoffPolicy": d.backoff_policy, "backoffDelay": d.backoff_delay, "timeout": d.timeout,
        "deadLetterSink": {"ref": {"apiVersion": "eventing.knative.dev/v1alpha1", "kind": "KafkaSink",
                                   "name": f"{t.name}-dlq"}}}}
    if filters:
        spec["filters"] = filters
    return {"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
            "metadata": {"name": t.name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "cascade"},
                         "annotations": {"kafka.eventing.knative.dev/delivery.order": t.ordering}},
            "spec": spec}


def dead_letter_sink(t: Trigger, namespace: str, bootstrap: str = KAFKA_BOOTSTRAP) -> dict[str, Any]:
    return {"apiVersion": "eventing.knative.dev/v1alpha1", "kind": "KafkaSink",
            "metadata": {"name": f"{t.name}-dlq", "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "cascade"}},
            "spec": {"topic": t.dead_letter_topic, "bootstrapServers": [bootstrap], "numPartitions": 4,
                     "replicationFactor": 3}}


def documents(spec: FunctionSpec, namespace: str = "cascade", image: str | None = None) -> list[dict[str, Any]]:
    docs = [service(spec, namespace, image)]
    for t in spec.trigger_models():
        docs += [trigger(t, namespace), dead_letter_sink(t, namespace)]
    return docs
