"""The Kubernetes backend: server-side apply of the operator resource, status, logs, cancel, watch.

The resource comes from ``kinds.render`` (with the matcher's placement) and goes into the
project's namespace with field manager ``cascade``. Status is read from each operator's own
shape (Kubeflow conditions, Volcano ``state.phase``, KubeRay ``jobDeploymentStatus`` and
``jobStatus``, Spark ``applicationState.state``); a failure carries the operator's message
and the pods' termination messages (their log tails); a success carries the metrics the job wrote
(``metrics.json`` is the pods' termination message file). A trial's resource and pods carry its
labels, and a Secret with its report credential sits beside them for the metrics-reporter. ``watch`` follows the resources over the
API server's watch protocol (resource versions, reconnects) and wakes the job watcher at once.
Errors carry the API server's own explanation; 4xx answers are permanent, the rest retryable.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from cascade.core.credentials import job_credential
from cascade.core.errors import NotFound
from cascade.core.kube import explain
from cascade.events import jobrecords as records
from cascade.functions.training import kinds
from cascade.functions.training.backends.base import Change
from cascade.functions.training.job import TrainingJob
from cascade.stores import StateStore

FIELD_MANAGER = "cascade"
SELECTOR = "app.kubernetes.io/part-of=cascade"
WATCHED = [("kubeflow.org", "v1", p) for p in ("pytorchjobs", "tfjobs", "xgboostjobs", "paddlejobs", "jaxjobs",
                                               "mpijobs")] + [
    ("batch.volcano.sh", "v1alpha1", "jobs"), ("ray.io", "v1", "rayjobs"),
    ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")]
log = logging.getLogger("cascade.training")

VOLCANO = {"Pending": "launching", "Running": "running", "Restarting": "running", "Completing": "running",
           "Completed": "succeeded", "Failed": "failed", "Aborted": "failed", "Aborting": "failed",
           "Terminated": "failed", "Terminating": "failed"}
RAY_JOB = {"SUCCEEDED": "succeeded", "FAILED": "failed", "STOPPED": "failed", "RUNNING": "running"}
SPARK = {"COMPLETED": "succeeded", "FAILED": "failed", "SUBMISSION_FAILED": "failed", "RUNNING": "running",
         "SUCCEEDING": "running", "FAILING": "running", "PENDING_RERUN": "running", "INVALIDATING": "running"}


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.partition("/")
    return group, version


def phase(resource: dict[str, Any]) -> str:
    """'launching', 'running', 'succeeded' or 'failed' from the resource's operator's status."""
    status = resource.get("status") or {}
    kind = resource.get("kind", "")
    if kind == "RayJob":
        if status.get("jobDeploymentStatus") == "Failed":  # e.g. activeDeadlineSeconds passed
            return "failed"
        return RAY_JOB.get(str(status.get("jobStatus", "")), "running" if status.get("jobDeploymentStatus") in (
            "Running", "Complete") else "launching")
    if kind == "SparkApplication":
        return SPARK.get(str((status.get("applicationState") or {}).get("state", "")), "launching")
    if kind == "Job":
        return VOLCANO.get(str((status.get("state") or {}).get("phase", "")), "launching")
    true = {c.get("type") for c in status.get("conditions") or [] if c.get("status") == "True"}
    for final in ("Failed", "Succeeded"):
        if final in true:
            return final.lower()
    return "running" if true & {"Running", "Restarting"} else "launching"


def reason(resource: dict[str, Any]) -> str:
    """Why the operator says the job failed, in its own words."""
    status = resource.get("status") or {}
    words = [str(c.get("message") or c.get("reason") or "") for c in status.get("conditions") or []
             if c.get("type") == "Failed" and c.get("status") == "True"]
    words += [str(status.get(k) or "") for k in ("reason", "message")]
    words += [str((status.get("state") or {}).get(k) or "") for k in ("reason", "message")]
    words.append(str((status.get("applicationState") or {}).get("errorMessage") or ""))
    said = "; ".join(dict.fromkeys(w for w in words if w))
    return f"{resource.get('kind')} {resource['metadata']['name']} failed" + (f": {said}" if said else "")


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, api: k8s.ApiClient, store: StateStore, namespace_prefix: str = "", platform_token: str = "",
                 cluster: str = "") -> None:
        self.api, self.store, self.prefix = api, store, namespace_prefix
        self.platform_token = platform_token  # derives each trial's report credential
        self.cluster = cluster  # the inventory's cluster this client reaches ("": the platform's own)
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
        except Exception as exc:  # noqa: BLE001 - ApiException or the connection's own error, both explained
            raise explain(f"apply {resource['kind']} {meta['namespace']}/{meta['name']}", exc) from exc
        return cast(dict[str, Any], result)

    def launch(self, job: TrainingJob, extensions: Mapping[str, str]) -> None:
        resource = kinds.render(job, self.namespace(job.project))
        applied = self.apply(resource)
        if "trial" in (job.spec.get("labels") or {}):
            meta = resource["metadata"]
            owner = applied or self._get({"apiVersion": resource["apiVersion"], "kind": resource["kind"],
                                          "namespace": meta["namespace"], "name": meta["name"]})
            if owner is None:
                raise NotFound(f"{resource['kind']} {meta['namespace']}/{meta['name']} vanished right after it was applied")
            self._report_secret(job, owner)
        records.update(self.store, job.id, "launching", backend=self.name, placement=job.placement.to_dict(),
                       project=job.project, spec=job.spec, extensions=dict(extensions), cluster=self.cluster,
                       resource={"apiVersion": resource["apiVersion"], "kind": resource["kind"],
                                 "namespace": resource["metadata"]["namespace"], "name": resource["metadata"]["name"]})

    def _report_secret(self, job: TrainingJob, owner: dict[str, Any]) -> None:
        """The Secret the trial's metrics-reporter reads its credential from, owned by (and deleted with) the job."""
        if not self.platform_token:
            log.warning("no platform credential: trial %s's pods cannot report intermediate metrics", job.id)
            return
        meta = owner["metadata"]
        token = base64.b64encode(job_credential(self.platform_token, job.id).encode()).decode()
        secret: Any = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "data": {"token": token},
                  "metadata": {"name": kinds.report_secret(job), "namespace": meta["namespace"],
                               "labels": {"app.kubernetes.io/part-of": "cascade", "cascade.io/job": job.name},
                               "ownerReferences": [{"apiVersion": owner["apiVersion"], "kind": owner["kind"],
                                                    "name": meta["name"], "uid": meta["uid"]}]}}
        try:  # create only: the platform may not read or change a project's other Secrets
            self.core.create_namespaced_secret(meta["namespace"], secret, field_manager=FIELD_MANAGER)
        except Exception as exc:  # noqa: BLE001 - ApiException or the connection's own error, both explained
            if isinstance(exc, k8s.ApiException) and exc.status == 409:
                return  # a relaunch: the credential is derived from the job id, so it is the same one
            raise explain(f"create Secret {meta['namespace']}/{secret['metadata']['name']}", exc) from exc

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
        except Exception as exc:  # noqa: BLE001 - ApiException or the connection's own error, both explained
            if isinstance(exc, k8s.ApiException) and exc.status == 404:
                return None
            raise explain(f"get {r['kind']} {r['namespace']}/{r['name']}", exc) from exc
        return cast(dict[str, Any], obj)

    def status(self, job_id: str) -> str:
        record = self.store.get_record("job", job_id) or {}
        if record.get("status") == "cancelled":
            return "cancelled"
        obj = self._get(self._resource(job_id))
        if obj is None:
            return "cancelled" if record.get("cancelRequested") else "failed"
        return phase(obj)

    def cancel(self, job_id: str, reason: str = "cancelled on request") -> None:
        status = (self.store.get_record("job", job_id) or {}).get("status")
        if status == "queued":  # not running: the scheduler drops it from its queue
            records.update(self.store, job_id, "cancelled", reason=reason, requeued=False)
            return
        r = self._resource(job_id)
        if status in records.FINAL:
            return
        group, version = _group_version(r["apiVersion"])
        try:
            self.custom.delete_namespaced_custom_object(group, version, r["namespace"], kinds.plural(r["kind"]),
                                                        r["name"])
        except k8s.ApiException as exc:
            if exc.status != 404:
                raise explain(f"delete {r['kind']} {r['namespace']}/{r['name']}", exc) from exc
        # The job watcher's next pass (the watch wakes it at once) publishes job.cancelled with this reason, and the
        # scheduler gives the job's booking back on it.
        records.update(self.store, job_id, str(status), cancelRequested=True, cancelReason=reason)

    def _pods(self, r: dict[str, str]) -> list[Any]:
        try:
            return list(self.core.list_namespaced_pod(r["namespace"], label_selector=f"cascade.io/job={r['name']}").items)
        except Exception as exc:  # noqa: BLE001
            raise explain(f"list the pods of {r['kind']} {r['namespace']}/{r['name']}", exc) from exc

    def metrics(self, r: dict[str, str]) -> dict[str, Any]:
        """The metrics the job wrote (``metrics.json``, which the pods report as their termination message)."""
        found: dict[str, Any] = {}
        for pod in sorted(self._pods(r), key=lambda p: str(p.metadata.name), reverse=True):  # rank 0 last: it wins
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                done = cs.state.terminated if cs.state is not None else None
                if done is None or done.exit_code or not done.message:
                    continue
                try:
                    said = json.loads(done.message)
                except ValueError:
                    continue
                if isinstance(said, dict):
                    found.update({k: v for k, v in said.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
        return found

    def log_tails(self, r: dict[str, str]) -> str:
        """The pods' termination messages (``FallbackToLogsOnError``: the last lines of a failed container's log)."""
        tails = []
        for pod in self._pods(r):
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                for state in (cs.state, cs.last_state):
                    done = state.terminated if state is not None else None
                    if done is not None and done.exit_code and done.message:
                        tails.append(f"==> {pod.metadata.name} (exit {done.exit_code}) <==\n{done.message.strip()}")
        return "\n".join(dict.fromkeys(tails))

    def reconcile(self) -> list[Change]:
        changes = []
        for record in self.store.find_records("job", backend=self.name):
            if record.get("status") in (*records.FINAL, "queued") or "resource" not in record:
                continue  # ended, or waiting for room again after a preemption deleted its resource
            if record.get("cluster", "") != self.cluster:
                continue  # another cluster's job: its own client follows it
            r = record["resource"]
            obj = self._get(r)
            now = ("cancelled" if record.get("cancelRequested") else "failed") if obj is None else phase(obj)
            if now == record.get("status") or now == "launching":
                continue
            data: dict[str, Any]
            if now == "cancelled":
                data = {"reason": str(record.get("cancelReason") or "cancelled on request")}
            elif now == "succeeded":
                data = {"artifactUri": str(record.get("artifactUri") or f"k8s://{r['namespace']}/{r['name']}"),
                        "framework": str((record.get("spec") or {}).get("framework", ""))}
                metrics = self.metrics(r)
                if metrics:
                    data["metrics"] = metrics
            elif now == "failed":
                why = "the job's resource was deleted" if obj is None else reason(obj)
                tail = self.log_tails(r)
                data = {"reason": f"{why}\n{tail}"[:4000] if tail else why}
            else:
                data = {"backend": self.name, "kind": r["kind"], "placement": record.get("placement") or {}}
            extra = {"reason": data["reason"]} if "reason" in data else {}
            changes.append(Change(record["id"], now, data, record.get("extensions") or {},
                                  commit=self._committer(str(record["id"]), now, extra)))
        return changes

    def _committer(self, job_id: str, status: str, extra: dict[str, Any]) -> Callable[[], None]:
        def commit() -> None:
            records.update(self.store, job_id, status, **extra)
        return commit

    def logs(self, job_id: str) -> str:
        r = self._resource(job_id)
        out = []
        for pod in self._pods(r):
            name = str(pod.metadata.name)
            try:
                out.append(f"==> {name} <==\n" + self.core.read_namespaced_pod_log(name, r["namespace"]))
            except k8s.ApiException as exc:  # no kubelet reachable (or the pod never ran): say why
                out.append(f"==> {name} <==\n({explain('read the log', exc)})\n")
        return "".join(out)

    def watch(self, wake: Callable[[], None], stop: threading.Event) -> list[threading.Thread]:
        """Follow every training kind's resources cluster-wide; ``wake`` on every change (one thread a kind)."""
        threads = [threading.Thread(target=self._follow, args=(g, v, p, wake, stop), name=f"watch-{p}", daemon=True)
                   for g, v, p in WATCHED]
        for t in threads:
            t.start()
        return threads

    def _follow(self, group: str, version: str, plural: str, wake: Callable[[], None], stop: threading.Event) -> None:
        version_seen: str | None = None
        pause = 1.0
        while not stop.is_set():
            watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]
            try:
                if version_seen is None:  # list first: a resource version to watch from, and no change missed
                    listed = cast(dict[str, Any], self.custom.list_cluster_custom_object(
                        group, version, plural, label_selector=SELECTOR))
                    version_seen = str(listed["metadata"]["resourceVersion"])
                    wake()
                for event in watcher.stream(  # type: ignore[no-untyped-call]
                        self.custom.list_cluster_custom_object, group, version, plural, label_selector=SELECTOR,
                        resource_version=version_seen, timeout_seconds=30, allow_watch_bookmarks=True):
                    obj = event["object"]
                    version_seen = str(obj["metadata"]["resourceVersion"])
                    if event["type"] != "BOOKMARK":
                        wake()
                    if stop.is_set():
                        break
                pause = 1.0
            except k8s.ApiException as exc:
                if exc.status == 410:  # the version is too old: list again
                    version_seen = None
                    continue
                if exc.status == 504:  # "Too large resource version": the API server's cache lags; list again,
                    version_seen = None  # as client-go's reflector does, and the list itself wakes the caller
                log.warning("watch %s.%s: %s", plural, group, explain("watch", exc))
                stop.wait(pause)
                pause = min(pause * 2, 8.0)
            except Exception as exc:  # noqa: BLE001 - the API server went away: reconnect with back-off
                log.warning("watch %s.%s: %s", plural, group, explain("watch", exc))
                stop.wait(pause)
                pause = min(pause * 2, 8.0)
            finally:
                watcher.stop()  # type: ignore[no-untyped-call]
