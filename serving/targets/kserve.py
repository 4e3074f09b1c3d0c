"""The KServe deploy target: server-side apply an InferenceService and wait for it to be Ready.

The InferenceService comes from ``cascade.serving.kserve`` (the kserve SDK's models) in the
project's namespace; a canary share applies only when another version of the model is live.
Ready → deployed; a failed condition (or no answer within ``timeout``, which stays under the
deploy-model trigger's 300 s delivery timeout) → DeployFailed with the controller's or the API
server's own explanation.
"""

from __future__ import annotations

import time
from typing import Any, cast

from kubernetes import client as k8s

from cascade.core.errors import InvalidInput
from cascade.core.kube import explain
from cascade.scheduling.accelerators import parse
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Job
from cascade.serving import kserve
from cascade.serving.targets.base import Deployed, DeployFailed, Release, deploy_each

FIELD_MANAGER = "cascade"
FRAMEWORK = {"sklearn": "sklearn", "xgboost": "xgboost", "tensorflow": "tensorflow"}  # the rest run on PyTorch


class KServeTarget:
    name = "kserve"

    def __init__(self, api: k8s.ApiClient, namespace_prefix: str = "", *, timeout: float = 240.0,
                 poll: float = 1.0, matcher: Matcher | None = None) -> None:
        self.custom = k8s.CustomObjectsApi(api)
        self.prefix, self.timeout, self.poll, self.matcher = namespace_prefix, timeout, poll, matcher

    def placement(self, release: Release) -> dict[str, Any] | None:
        """The matcher's answer for the release's accelerator (card limits, node selector, tolerations)."""
        if self.matcher is None or release.accelerator in ("", "0"):
            return None
        try:
            job = Job(f"{release.model}-{release.version}", parse(release.accelerator), 1,
                      FRAMEWORK.get(release.format, "pytorch"), release.project)
            return self.matcher.place(job).pod().to_dict()
        except InvalidInput as exc:
            raise DeployFailed(f"{release.model} {release.version}: {exc}") from exc

    def namespace(self, project: str) -> str:
        return f"{self.prefix}{project}"

    def _get(self, namespace: str, model: str) -> dict[str, Any] | None:
        try:
            obj = self.custom.get_namespaced_custom_object(kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL,
                                                           model)
        except Exception as exc:  # noqa: BLE001 - ApiException or no answer from the API server, both explained
            if isinstance(exc, k8s.ApiException) and exc.status == 404:
                return None
            raise DeployFailed(str(explain(f"reading InferenceService {namespace}/{model}", exc))) from exc
        return cast(dict[str, Any], obj)

    def _apply(self, namespace: str, model: str, resource: dict[str, Any]) -> None:
        try:
            self.custom.patch_namespaced_custom_object(
                kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL, model, resource,
                field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")
        except Exception as exc:  # noqa: BLE001 - ApiException or no answer, both explained
            raise DeployFailed(str(explain(f"applying InferenceService {namespace}/{model}", exc))) from exc

    def _settled(self, namespace: str, model: str, started: float) -> tuple[str, dict[str, Any]]:
        """Wait until the controller has seen the latest spec: ('ready' | 'failed' | 'pending', the object)."""
        while True:
            obj = self._get(namespace, model) or {}
            state = kserve.phase(obj)
            if state != "pending" or time.monotonic() - started > self.timeout:
                return state, obj
            time.sleep(self.poll)

    def deploy(self, release: Release) -> Deployed:
        namespace = self.namespace(release.project)
        started = time.monotonic()
        live = self._get(namespace, release.model)
        serving = kserve.traffic(live) if live is not None else {}
        previous = max(serving, key=lambda v: serving[v]) if serving else None
        resource = kserve.inference_service(
            {"model": release.model, "version": release.version, "artifactUri": release.artifact_uri,
             "sha256": release.sha256, "format": release.format,
             "canaryTrafficPercent": release.canary_percent, "signature": release.signature}, namespace,
            previous_version=previous if previous != release.version else None, placement=self.placement(release),
            cpu=release.cpu, memory=release.memory)
        self._apply(namespace, release.model, resource)
        state, obj = self._settled(namespace, release.model, started)
        if state == "failed":
            raise DeployFailed(f"InferenceService {namespace}/{release.model} failed: {kserve.failure(obj)}")
        if state != "ready":
            raise DeployFailed(f"InferenceService {namespace}/{release.model} was not Ready within "
                               f"{self.timeout:g}s: {kserve.failure(obj) or 'no status from the KServe controller'}")
        return Deployed(self.name, None, {"ready": round(time.monotonic() - started, 3)})

    def serving(self, model: str, project: str = "default") -> dict[str, int]:
        obj = self._get(self.namespace(project), model)
        return {} if obj is None else kserve.traffic(obj)

    def withdraw(self, model: str, version: str, project: str = "default") -> dict[str, int]:
        """The canary withdrawn: ``canaryTrafficPercent: 0`` (KServe's rollback to the previous revision); the
        previous version withdrawn: the canary takes all; the only version withdrawn: the InferenceService goes."""
        namespace = self.namespace(project)
        live = self._get(namespace, model)
        current = kserve.traffic(live) if live is not None else {}
        if live is None or version not in current:
            return current
        if len(current) == 1:
            try:
                self.custom.delete_namespaced_custom_object(kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL,
                                                            model)
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise DeployFailed(str(explain(f"deleting InferenceService {namespace}/{model}", exc))) from exc
            return {}
        self._apply(namespace, model, kserve.withdrawn(live, version))
        self._settled(namespace, model, time.monotonic())
        return self.serving(model, project)

    def restore(self, releases: list[Release]) -> list[str]:
        """InferenceServices outlive Cascade: only those missing are applied again."""
        return deploy_each(self, releases, lambda r: self._get(self.namespace(r.project), r.model) is not None)
