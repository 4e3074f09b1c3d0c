"""The DeployTarget protocol: where a released model version is made to serve.

Three implementations ship and pass ``tests/contract/test_deploy_target_contract.py``: ``local``
(the runtime's scale-to-zero model servers), ``kserve`` (an InferenceService, applied
server-side) and ``deployment`` (a Deployment per version behind one Service, without KServe). ``deploy-model`` turns a ``model.released`` into a :class:`Release`, asks the
target, and answers ``model.deployed`` or ``model.deploy_failed`` from what it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cascade.core.errors import PermanentError


@dataclass(frozen=True)
class Release:
    """What a ``model.released`` event asks for."""

    model: str
    version: str
    artifact_uri: str
    sha256: str
    format: str
    project: str = "default"
    canary_percent: int | None = None
    signature: Mapping[str, Any] | None = None  # V2 inputs/outputs, where the artifact does not declare them
    accelerator: str = "0"  # the accelerator request string to serve on (cluster targets place it with the matcher)
    cpu: str = "1"  # per serving replica, where the target sizes replicas (Kubernetes quantities)
    memory: str = "2Gi"

    @classmethod
    def from_event_data(cls, data: Mapping[str, Any], project: str = "default") -> Release:
        canary = data.get("canaryTrafficPercent")
        return cls(str(data["model"]), str(data["version"]), str(data["artifactUri"]), str(data["sha256"]),
                   str(data["format"]), project, None if canary is None else int(canary), data.get("signature"),
                   str(data.get("accelerator") or "0"), str((data.get("resources") or {}).get("cpu") or "1"),
                   str((data.get("resources") or {}).get("memory") or "2Gi"))


@dataclass(frozen=True)
class Deployed:
    """A version that answers: where, and how long each step took (seconds)."""

    target: str
    endpoint: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)


class DeployFailed(PermanentError):
    """The version does not serve; the previous one (if any) keeps its traffic."""

    def __init__(self, reason: str, serving: str | None = None) -> None:
        super().__init__(reason)
        self.serving = serving  # the version that still answers, if any


class DeployTarget(Protocol):
    name: str

    def deploy(self, release: Release) -> Deployed:
        """Make ``release`` serve (its canary share, if any); raise DeployFailed with the reason."""
        ...

    def serving(self, model: str, project: str = "default") -> dict[str, int]:
        """The versions of ``project``'s ``model`` that take traffic, with their percent (empty: not served)."""
        ...

    def withdraw(self, model: str, version: str, project: str = "default") -> dict[str, int]:
        """Stop ``version`` taking traffic (the other live version, if any, takes all of it); the split after.
        Withdrawing a version that is not live changes nothing."""
        ...

    def restore(self, releases: list[Release]) -> list[str]:
        """After a restart: make the released versions serve again; the ``model:version`` that failed."""
        ...


def deploy_each(target: DeployTarget, releases: list[Release],
                present: Callable[[Release], bool] = lambda release: False) -> list[str]:
    """``restore``'s loop: deploy each release not ``present`` already; the ``model:version`` that failed."""
    failed = []
    for release in releases:
        if present(release):
            continue
        try:
            target.deploy(release)
        except DeployFailed:
            failed.append(f"{release.model}:{release.version}")
    return failed
