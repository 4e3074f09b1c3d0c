"""The KServe deploy target: server-side apply an InferenceService and wait for it to be Ready.

The InferenceService comes from ``cascade.serving.kserve`` (the kserve SDK's models) in the
project's namespace; a canary share applies only when another version of the model is live.
Ready → deployed; a failed condition (or no answer within ``timeout``) → DeployFailed.
"""

from __future__ import annotations

import time
from typing import Any, cast

from kubernetes import client as k8s

from cascade.serving import kserve
from cascade.serving.targets.base import Deployed, DeployFailed, Release

FIELD_MANAGER = "cascade"


class KServeTarget:
    name = "kserve"

    def __init__(self, api: k8s.ApiClient, namespace_prefix: str = "", *, timeout: float = 600.0,
                 poll: float = 2.0) -> None:
        self.custom = k8s.CustomObjectsApi(api)
        self.prefix, self.timeout, self.poll = namespace_prefix, timeout, poll

    def namespace(self, project: str) -> str:
        return f"{self.prefix}{project}"

    def _get(self, namespace: str, model: str) -> dict[str, Any] | None:
        try:
            obj = self.custom.get_namespaced_custom_object(kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL,
                                                           model)
        except k8s.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return cast(dict[str, Any], obj)

    def deploy(self, release: Release) -> Deployed:
        namespace = self.namespace(release.project)
        started = time.monotonic()
        try:
            live = self._get(namespace, release.model)
            serving = kserve.traffic(live) if live is not None else {}
            previous = max(serving, key=lambda v: serving[v]) if serving else None
            resource = kserve.inference_service(
                {"model": release.model, "version": release.version, "artifactUri": release.artifact_uri,
                 "sha256": release.sha256, "format": release.format,
                 "canaryTrafficPercent": release.canary_percent}, namespace,
                previous_version=previous if previous != release.version else None)
            self.custom.patch_namespaced_custom_object(
                kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL, release.model, resource,
                field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")
            state = "pending"
            while True:
                state = kserve.phase(self._get(namespace, release.model) or {})
                if state != "pending" or time.monotonic() - started > self.timeout:
                    break
                time.sleep(self.poll)
        except k8s.ApiException as exc:
            raise DeployFailed(f"applying InferenceService {namespace}/{release.model}: {exc.status} {exc.reason}") \
                from exc
        if state != "ready":
            raise DeployFailed(f"InferenceService {namespace}/{release.model} is {state}")
        return Deployed(self.name, None, {"ready": round(time.monotonic() - started, 3)})

    def serving(self, model: str, project: str = "default") -> dict[str, int]:
        obj = self._get(self.namespace(project), model)
        return {} if obj is None else kserve.traffic(obj)

    def withdraw(self, model: str, version: str, project: str = "default") -> dict[str, int]:
        """The canary withdrawn: ``canaryTrafficPercent: 0`` (KServe's rollback to the previous revision); the
        previous version withdrawn: the canary takes all; the only version withdrawn: the InferenceService goes."""
        namespace = self.namespace(project)
        try:
            live = self._get(namespace, model)
            current = kserve.traffic(live) if live is not None else {}
            if live is None or version not in current:
                return current
            if len(current) == 1:
                self.custom.delete_namespaced_custom_object(kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL,
                                                            model)
                return {}
            resource = kserve.withdrawn(live, version)
            self.custom.patch_namespaced_custom_object(
                kserve.GROUP, kserve.VERSION, namespace, kserve.PLURAL, model, resource,
                field_manager=FIELD_MANAGER, force=True, _content_type="application/apply-patch+yaml")
        except k8s.ApiException as exc:
            raise DeployFailed(f"withdrawing {version} of InferenceService {namespace}/{model}: "
                               f"{exc.status} {exc.reason}") from exc
        return self.serving(model, project)

    def restore(self, releases: list[Release]) -> list[str]:
        """InferenceServices outlive Cascade: only those missing are applied again."""
        failed = []
        for release in releases:
            if self._get(self.namespace(release.project), release.model) is not None:
                continue
            try:
                self.deploy(release)
            except DeployFailed:
                failed.append(f"{release.model}:{release.version}")
        return failed
