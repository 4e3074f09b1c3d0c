"""The local deploy target: fetch the artifact into the checksum cache, load it in the runtime.

The runtime (``PUT /_runtime/models/<model>/versions/<version>``) answers once the model
server has loaded the version, so ``deploy`` returns only for a version that answers.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from cascade.core.credentials import auth_header
from cascade.core.errors import CascadeError
from cascade.serving import artifacts
from cascade.serving.artifacts import ArtifactPolicy
from cascade.serving.targets.base import Deployed, DeployFailed, Release, deploy_each


class LocalTarget:
    name = "local"

    def __init__(self, runtime_url: str, cache: Path, policy: ArtifactPolicy, annotations: Mapping[str, str] | None = None,
                 *, token: str = "", timeout: float = 300.0) -> None:
        self.runtime_url, self.cache, self.policy, self.timeout = runtime_url.rstrip("/"), cache, policy, timeout
        self.annotations = dict(annotations or {})
        self.headers = auth_header(token)  # the runtime's admin API takes the platform credential

    def deploy(self, release: Release) -> Deployed:
        started = time.monotonic()
        try:
            local = artifacts.fetch(release.artifact_uri, release.sha256, self.cache, self.policy)
            artifacts.check_base(local, release.format, self.policy)
        except CascadeError as exc:
            raise DeployFailed(str(exc)) from exc
        fetched = time.monotonic() - started
        url = f"{self.runtime_url}/_runtime/models/{release.model}/versions/{release.version}"
        body: dict[str, Any] = {"artifact": str(local), "format": release.format, "annotations": self.annotations,
                                "project": release.project}
        if release.canary_percent is not None:
            body["canaryTrafficPercent"] = release.canary_percent
        if release.signature:
            body["signature"] = dict(release.signature)
        try:
            reply = httpx.put(url, json=body, headers=self.headers, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise DeployFailed(f"runtime unreachable at {url}: {exc}") from exc
        try:
            answer = reply.json()
        except ValueError:
            answer = {"message": reply.text}
        if reply.status_code != 200:
            still = answer.get("serving") or []
            raise DeployFailed(f"{answer.get('message', reply.text)}: {str(answer.get('log', ''))[-800:]}",
                               str(still[0]) if still else None)
        return Deployed(self.name, f"{self.runtime_url}/v1/models/{release.model}:predict",
                        {"download": round(fetched, 3), "load": float(answer.get("loadSeconds", 0.0))})

    def serving(self, model: str, project: str = "default") -> dict[str, int]:
        try:
            reply = httpx.get(f"{self.runtime_url}/_runtime/models", headers=self.headers, timeout=10)
        except httpx.HTTPError:
            return {}
        routes = (reply.json() if reply.status_code == 200 else {}).get(model) or []
        return {str(r["version"]): int(r["percent"]) for r in routes}

    def withdraw(self, model: str, version: str, project: str = "default") -> dict[str, int]:
        url = f"{self.runtime_url}/_runtime/models/{model}/versions/{version}"
        try:
            reply = httpx.delete(url, headers=self.headers, timeout=30)
        except httpx.HTTPError as exc:
            raise DeployFailed(f"runtime unreachable at {url}: {exc}") from exc
        if reply.status_code != 200:
            raise DeployFailed(f"withdrawing {model} {version}: {reply.status_code} {reply.text[:300]}")
        return self.serving(model, project)

    def restore(self, releases: list[Release]) -> list[str]:
        return deploy_each(self, releases)
