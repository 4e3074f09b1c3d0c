"""The Kubernetes backend: server-side apply of the operator resource, status, logs, cancel.

The resource comes from ``kinds.render`` (with the matcher's placement) and goes into the
project's namespace with field manager ``cascade``. Status is read from the resource's
conditions (Kubeflow ``Succeeded``/``Failed``, Volcano ``state.phase``, RayJob
``jobStatus``, Spark ``applicationState.state``); logs come from the pods labelled with the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from kubernetes import client as k8s

from cascade.core.errors import NotFound, RetryableError
from cascade.events import jobrecords as records
from cascade.functions.training import kinds
from cascade.functions.training.backends.base import Change
from cascade.functions.training.job import TrainingJob
from cascade.stores import StateStore

FIELD_MANAGER = "cascade"


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.partition("/")
    return group, version


def phase(resource: dict[str, Any]) -> str:
    """'running', 'succeeded' or 'failed' from any of the operators' status shapes (no status yet: running)."""
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

    def launch(self, job: TrainingJob, extensions: Mapping[str, str]) -> None:
        resource = kinds.render(job, self.namespace(job.project))
        self.apply(resource)
        records.update(self.store, job.id, "launching", backend=self.name, placement=job.placement.to_dict(),
                       project=job.project, spec=job.spec, extensions=dict(extensions),
                       resource={"apiVersion": resource["apiVersion"], "kind": resource["kind"],
                                 "namespace": resource["metadata"]["namespace"], "name": resource["metadata"]["name"]})

    def _resource(self, job_id: str) -> dict[str, str]:
        record = self.store.get_record("job", job_id)
        if record is None or "resource" not in record:
            raise NotFound(f"no Kubernetes job {job_id!r}")
        return dict(record["resource"])

    def _get(self, r: dict[str, str]) -> dict[str, Any] | None:
        group, version = _group_version(r["apiVersion"])
        try:
            obj = self.custom.get_namespaced_custom_object(group, version, r["namespace"], kinds.plural(r["kind"]),
                                                           r["name"])
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise RetryableError(f"get {r['kind']} {r['name']}: {exc.status} {exc.reason}") from exc
        return cast(dict[str, Any], obj)

    def status(self, job_id: str) -> str:
        record = self.store.get_record("job", job_id) or {}
        if record.get("status") == "cancelled":
            return "cancelled"
        obj = self._get(self._resource(job_id))
        return "failed" if obj is None else phase(obj)

    def cancel(self, job_id: str) -> None:
        r = self._resource(job_id)
        if (self.store.get_record("job", job_id) or {}).get("status") in records.FINAL:
            return
        group, version = _group_version(r["apiVersion"])
        try:
            self.custom.delete_namespaced_custom_object(group, version, r["namespace"], kinds.plural(r["kind"]),
                                                        r["name"])
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise RetryableError(f"delete {r['kind']} {r['name']}: {exc.status} {exc.reason}") from exc
        records.update(self.store, job_id, "cancelled", reason="deleted on request")

    def reconcile(self) -> list[Change]:
        changes = []
        for record in self.store.find_records("job", backend=self.name):
            if record.get("status") in records.FINAL or "resource" not in record:
                continue
            r = record["resource"]
            obj = self._get(r)
            now = "failed" if obj is None else phase(obj)
            if now == record.get("status") or (now == "running" and obj is not None and not obj.get("status")):
                continue
            data: dict[str, Any]
            if now == "succeeded":
                data = {"artifactUri": str(record.get("artifactUri") or f"k8s://{r['namespace']}/{r['name']}"),
                        "framework": str((record.get("spec") or {}).get("framework", ""))}
            elif now == "failed":
                data = {"reason": "the job's resource was deleted" if obj is None
                        else f"{r['kind']} {r['name']} reports Failed"}
            else:
                data = {"backend": self.name, "kind": r["kind"], "placement": record.get("placement") or {}}
            records.update(self.store, record["id"], now, **({"reason": data["reason"]} if "reason" in data else {}))
            changes.append(Change(record["id"], now, data, record.get("extensions") or {}))
        return changes

    def logs(self, job_id: str) -> str:
        r = self._resource(job_id)
        pods = self.core.list_namespaced_pod(r["namespace"], label_selector=f"cascade.io/job={r['name']}")
        names = [str(p.metadata.name) for p in pods.items if p.metadata is not None]
        return "".join(f"==> {n} <==\n" + self.core.read_namespaced_pod_log(n, r["namespace"]) for n in names)
