"""The plain Kubernetes deploy target, for clusters without KServe (a small K3s at an edge site).

Each version of a model is a Deployment ``<model>-v<version>`` whose pods fetch the artifact with
KServe's storage-initializer image (an init container: ``<storageUri> /mnt/models``, as KServe
runs it) and serve it with Cascade's model server, exactly as the KServe target's custom
predictor does. One Service ``<model>`` selects the pods of every live version, so a canary's
share is its share of the replicas (20 %: four pods of the previous version, one of the canary;
a split that needs more than ten pods is rounded); the split asked for is kept in the Service's
``cascade.io/traffic`` annotation. A version is released once its Deployment has all its replicas
available for the latest spec, and serves while any are available (a scale that follows a withdrawn
canary does not take it out of service); a rollout past its progress deadline is a failure with the
controller's message. A full release removes the other versions once it is available.
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

from kubernetes import client as k8s

from cascade.core.kube import explain
from cascade.serving import kserve
from cascade.serving.targets.base import Deployed, DeployFailed, Release, deploy_each

FIELD_MANAGER = "cascade"
TRAFFIC = "cascade.io/traffic"
SERVES = "cascade.io/serves"
MAX_PODS = 10


def version_tag(version: str) -> str:
    """A version as part of a Kubernetes name."""
    return re.sub(r"[^a-z0-9-]", "-", version.lower()).strip("-")[:20] or "0"


def replicas_for(split: dict[str, int]) -> dict[str, int]:
    """Pods per version so each version's share of the pods is its share of the traffic (at most ten pods)."""
    if len(split) == 1:
        return {v: 1 for v in split}
    g = math.gcd(*split.values())
    exact = {v: p // g for v, p in split.items()}
    if sum(exact.values()) <= MAX_PODS:
        return exact
    return {v: max(1, round(p * MAX_PODS / 100)) for v, p in split.items()}


class DeploymentTarget:
    name = "deployment"

    def __init__(self, api: k8s.ApiClient, namespace_prefix: str = "", *, timeout: float = 240.0, poll: float = 1.0,
                 storage_initializer: str = "kserve/storage-initializer:v0.15.2") -> None:
        self.apps, self.core = k8s.AppsV1Api(api), k8s.CoreV1Api(api)
        self.prefix, self.timeout, self.poll, self.initializer = namespace_prefix, timeout, poll, storage_initializer

    def namespace(self, project: str) -> str:
        return f"{self.prefix}{project}"

    # -- reading -----------------------------------------------------------------------------
    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - ApiException or no answer from the API server, both explained
            if isinstance(exc, k8s.ApiException) and exc.status == 404:
                return None
            raise DeployFailed(str(explain(what, exc))) from exc

    def _service(self, namespace: str, model: str) -> dict[str, Any] | None:
        found = self._call(f"reading Service {namespace}/{model}", self.core.read_namespaced_service, model, namespace)
        return None if found is None else dict(self.core.api_client.sanitize_for_serialization(found))

    def _deployments(self, namespace: str, model: str) -> dict[str, dict[str, Any]]:
        found = self._call(f"listing Deployments of {model} in {namespace}", self.apps.list_namespaced_deployment,
                           namespace, label_selector=f"cascade.io/model={model}")
        items = [] if found is None else self.apps.api_client.sanitize_for_serialization(found)["items"]
        return {str(d["metadata"]["labels"]["cascade.io/version"]): d for d in items}

    @staticmethod
    def _state(deployment: dict[str, Any]) -> str:
        """'ready', 'failed' or 'pending', for the Deployment's latest spec."""
        status, meta = deployment.get("status") or {}, deployment["metadata"]
        if int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 0):
            return "pending"
        for condition in status.get("conditions") or []:
            if (condition.get("type") == "Progressing" and condition.get("status") == "False") or \
                    (condition.get("type") == "ReplicaFailure" and condition.get("status") == "True"):
                return "failed"
        wanted = int((deployment.get("spec") or {}).get("replicas") or 0)
        return "ready" if int(status.get("availableReplicas") or 0) >= wanted > 0 else "pending"

    @staticmethod
    def _available(deployment: dict[str, Any]) -> bool:
        """Whether a released version's pods answer: it has available replicas, even while a scale to a new
        replica count (a newer generation) is under way. Only a rollout waits for the whole latest spec."""
        return int((deployment.get("status") or {}).get("availableReplicas") or 0) > 0

    @staticmethod
    def _why(deployment: dict[str, Any]) -> str:
        for condition in (deployment.get("status") or {}).get("conditions") or []:
            if condition.get("status") != ("True" if condition.get("type") != "ReplicaFailure" else "False"):
                return ": ".join(str(condition[k]) for k in ("reason", "message") if condition.get(k))
        return ""

    # -- writing -----------------------------------------------------------------------------
    def _deployment(self, release: Release, namespace: str, replicas: int, serving: bool) -> dict[str, Any]:
        resources = {"limits": {"cpu": release.cpu, "memory": release.memory},
                     "requests": {"cpu": release.cpu, "memory": release.memory}}
        container = kserve.model_server(
            {"model": release.model, "version": release.version, "artifactUri": release.artifact_uri,
             "format": release.format, "signature": release.signature}, resources)
        container["name"] = "model-server"
        container["volumeMounts"] = [{"name": "models", "mountPath": "/mnt/models", "readOnly": True}]
        container["readinessProbe"] = {"httpGet": {"path": "/healthz", "port": 8080}}
        labels = {"app.kubernetes.io/part-of": "cascade", "cascade.io/model": release.model,
                  "cascade.io/version": release.version}
        pod_labels = {**labels, SERVES: "yes" if serving else "no"}  # a canary at 0 % runs outside the Service
        initializer = {"name": "storage-initializer", "image": self.initializer,
                       "args": [release.artifact_uri, "/mnt/models"],
                       "volumeMounts": [{"name": "models", "mountPath": "/mnt/models"}],
                       "securityContext": container.get("securityContext")}
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": f"{release.model}-v{version_tag(release.version)}", "namespace": namespace,
                             "labels": labels, "annotations": {"cascade.io/sha256": release.sha256}},
                "spec": {"replicas": replicas, "progressDeadlineSeconds": int(self.timeout),
                         "selector": {"matchLabels": {"cascade.io/model": release.model,
                                                      "cascade.io/version": release.version}},
                         "template": {"metadata": {"labels": pod_labels},
                                      "spec": {"initContainers": [initializer], "containers": [container],
                                               "volumes": [{"name": "models", "emptyDir": {}}],
                                               "automountServiceAccountToken": False}}}}

    def _apply_deployment(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        self._call(f"applying Deployment {meta['namespace']}/{meta['name']}", self.apps.patch_namespaced_deployment,
                   meta["name"], meta["namespace"], body, field_manager=FIELD_MANAGER, force=True,
                   _content_type="application/apply-patch+yaml")

    def _scale(self, namespace: str, deployment: dict[str, Any], replicas: int) -> None:
        name = deployment["metadata"]["name"]
        self._call(f"scaling Deployment {namespace}/{name}", self.apps.patch_namespaced_deployment, name, namespace,
                   {"spec": {"replicas": replicas}})

    def _apply_service(self, namespace: str, model: str, split: dict[str, int]) -> None:
        body = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": model, "namespace": namespace,
                             "labels": {"app.kubernetes.io/part-of": "cascade", "cascade.io/model": model},
                             "annotations": {TRAFFIC: json.dumps(split, sort_keys=True)}},
                "spec": {"selector": {"cascade.io/model": model, SERVES: "yes"},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}
        self._call(f"applying Service {namespace}/{model}", self.core.patch_namespaced_service, model, namespace, body,
                   field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")

    def _delete(self, namespace: str, deployment: dict[str, Any]) -> None:
        name = deployment["metadata"]["name"]
        self._call(f"deleting Deployment {namespace}/{name}", self.apps.delete_namespaced_deployment, name, namespace)

    def _settled(self, namespace: str, model: str, version: str) -> tuple[str, dict[str, Any]]:
        started = time.monotonic()
        while True:
            deployment = self._deployments(namespace, model).get(version) or {"metadata": {}}
            state = self._state(deployment) if deployment["metadata"] else "pending"
            if state != "pending" or time.monotonic() - started > self.timeout:
                return state, deployment
            time.sleep(self.poll)

    # -- the protocol ------------------------------------------------------------------------
    def deploy(self, release: Release) -> Deployed:
        namespace, started = self.namespace(release.project), time.monotonic()
        live = self.serving(release.model, release.project)
        others = {v: p for v, p in live.items() if v != release.version}
        previous = max(others, key=lambda v: others[v]) if others else None
        canary = release.canary_percent if previous is not None else None
        split = {previous: 100 - canary, release.version: canary} if previous and canary else {release.version: 100}
        if previous and canary == 0:
            split = {previous: 100}
        pods = replicas_for({v: p for v, p in split.items() if p > 0} or {release.version: 100})
        self._apply_deployment(self._deployment(release, namespace, pods.get(release.version, 1),
                                                split.get(release.version, 0) > 0))
        state, deployment = self._settled(namespace, release.model, release.version)
        if state != "ready":
            reason = self._why(deployment) or "no status from the Deployment controller"
            if state == "failed":
                raise DeployFailed(f"Deployment {namespace}/{release.model}-v{version_tag(release.version)} failed: "
                                   f"{reason}", previous)
            raise DeployFailed(f"Deployment of {release.model} {release.version} was not available within "
                               f"{self.timeout:g}s: {reason}", previous)
        current = self._deployments(namespace, release.model)
        for version, other in current.items():
            if version == release.version:
                continue
            if version in split:
                self._scale(namespace, other, pods[version])
            else:
                self._delete(namespace, other)  # a full release: the other versions go once it is available
        self._apply_service(namespace, release.model, split)
        return Deployed(self.name, f"http://{release.model}.{namespace}.svc/v1/models/{release.model}:predict",
                        {"ready": round(time.monotonic() - started, 3)})

    def serving(self, model: str, project: str = "default") -> dict[str, int]:
        namespace = self.namespace(project)
        service = self._service(namespace, model)
        if service is None:
            return {}
        split: dict[str, int] = json.loads(((service.get("metadata") or {}).get("annotations") or {}).get(TRAFFIC)
                                           or "{}")
        ready = {v for v, d in self._deployments(namespace, model).items() if self._available(d)}
        live = {v: p for v, p in split.items() if v in ready and p > 0}
        if len(live) == 1:
            return {next(iter(live)): 100}
        return live

    def withdraw(self, model: str, version: str, project: str = "default") -> dict[str, int]:
        namespace = self.namespace(project)
        current = self.serving(model, project)
        if version not in current:
            return current
        deployments = self._deployments(namespace, model)
        rest = {v: p for v, p in current.items() if v != version}
        if version in deployments:
            self._delete(namespace, deployments[version])
        if not rest:
            self._call(f"deleting Service {namespace}/{model}", self.core.delete_namespaced_service, model, namespace)
            return {}
        keep = {next(iter(rest)): 100} if len(rest) == 1 else rest
        for v, pods in replicas_for(keep).items():
            if v in deployments:
                self._scale(namespace, deployments[v], pods)
        self._apply_service(namespace, model, keep)
        return keep

    def restore(self, releases: list[Release]) -> list[str]:
        """Deployments outlive Cascade: only missing ones are applied again."""
        return deploy_each(self, releases, lambda r: r.version in self._deployments(self.namespace(r.project), r.model))
