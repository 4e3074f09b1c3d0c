"""The Kubernetes backend: server-side apply of the operator resource, status, logs, cancel.

The resource comes from ``kinds.render`` (with the matcher's placement) and goes into the
project's namespace with field manager ``cascade``. Status is read from the resource's
conditions (Kubeflow ``Succeeded``/``Failed``, Volcano ``state.phase``, RayJob
``jobStatus``, Spark ``applicationState.state``); logs come from the pods labelled with the job.
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client as k8s

from cascade.core.errors import NotFound, RetryableError
from cascade.stores import StateStore
from cascade.functions.training import kinds, records
from cascade.functions.training.job import TrainingJob

FIELD_MANAGER = "cascade"


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.partition("/")
    return group, version


def phase(resource: dict[str, Any]) -> str:
    """'running', 'succeeded' or 'failed' from any of the operators' status shapes."""
    status = resource.get("status") or {}
    for condition in reversed(status.get("conditions") or []):
        if condition.get("status") == "True" and condition.get("type") in ("Succeeded", "Failed"):
            return str(condition["type"]).lower()
    state = (status.get("state") or {}).get("phase") or status.get("jobStatus") or (
        status.get("applicationState") or {}).get("state") or ""
    return {"Completed": "succeeded", "SUCCEEDED": "succeeded", "COMPLETED": "succeeded", "Failed": "failed",
            "FAILED": "failed", "Aborted": "failed", "STOPPED": "failed"}.get(str(state), "running")


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, api: k8s.ApiClient, store: StateStore, namespace_prefix: str = "") -> None:
        self.api, self.store, self.prefix = api, store, namespace_prefix
        self.custom = k8s.CustomObjectsApi(api)
        self.core = k8s.CoreV1Api(api)

    def namespace(self, project: str) -> str:
        return f"{self.prefix}{project}"

    def apply(self, resource: dict[str, Any]) -> dict[str, Any]:
        group, version = _group_version(resource["apiVersion"])
        meta = resource["metadata"]
        try:
            result = self.custom.patch_namespaced_custom_object(
                group, version, meta["namespace"], kinds.plural(resource["kind"]), meta["name"], resource,
                field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")
        except k8s.ApiException as exc:
            raise RetryableError(f"apply {resource['kind']} {meta['name']}: {exc.status} {exc.reason}") from exc
        return cast(dict[str, Any], result)

    def launch(self, job: TrainingJob, extensions: dict[str, str]) -> None:
        resource = kinds.render(job, self.namespace(job.project))
        self.apply(resource)
        records.update(self.store, job.id, "launching", backend=self.name, placement=job.placement,
                       resource={"apiVersion": resource["apiVersion"], "kind": resource["kind"],
                                 "namespace": resource["metadata"]["namespace"], "name": resource["metadata"]["name"]})

    def _resource(self, job_id: str) -> dict[str, str]:
        record = self.store.get_record("job", job_id)
        if record is None or "resource" not in record:
            raise NotFound(f"no Kubernetes job {job_id!r}")
        return dict(record["resource"])

    def status(self, job_id: str) -> str:
        r = self._resource(job_id)
        group, version = _group_version(r["apiVersion"])
        obj = self.custom.get_namespaced_custom_object(group, version, r["namespace"], kinds.plural(r["kind"]), r["name"])
        return phase(cast(dict[str, Any], obj))

    def cancel(self, job_id: str) -> None:
        r = self._resource(job_id)
        group, version = _group_version(r["apiVersion"])
        self.custom.delete_namespaced_custom_object(group, version, r["namespace"], kinds.plural(r["kind"]), r["name"])
        records.update(self.store, job_id, "cancelled", reason="deleted on request")

    def logs(self, job_id: str) -> str:
        r = self._resource(job_id)
        pods = self.core.list_namespaced_pod(r["namespace"], label_selector=f"cascade.io/job={r['name']}")
        names = [str(p.metadata.name) for p in pods.items if p.metadata is not None]
        return "".join(f"==> {n} <==\n" + self.core.read_namespaced_pod_log(n, r["namespace"]) for n in names)
