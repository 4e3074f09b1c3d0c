"""The deploy target plug-in point: the protocol (``base``), one module per target, one factory."""

from __future__ import annotations

from cascade.core.errors import InvalidInput
from cascade.core.settings import Settings
from cascade.serving.targets.base import Deployed, DeployFailed, DeployTarget, Release

__all__ = ["DeployFailed", "DeployTarget", "Deployed", "Release", "open_target"]


def open_target(cfg: Settings) -> DeployTarget:
    """The target ``cfg.serving.target`` names."""
    if cfg.serving.target == "kserve":
        from cascade.core.kube import api_client
        from cascade.scheduling.matcher import Matcher
        from cascade.scheduling.placement import Inventory
        from cascade.serving.targets.kserve import KServeTarget

        matcher = Matcher(Inventory.load(cfg.training.inventory)) if cfg.training.inventory else None
        return KServeTarget(api_client(), cfg.training.namespace_prefix, matcher=matcher)
    if cfg.serving.target == "deployment":
        from cascade.core.kube import api_client
        from cascade.serving.targets.deployment import DeploymentTarget

        return DeploymentTarget(api_client(), cfg.training.namespace_prefix,
                                storage_initializer=cfg.serving.storage_initializer)
    if cfg.serving.target == "local":
        from cascade.core.credentials import platform_token
        from cascade.serving.artifacts import ArtifactPolicy
        from cascade.serving.targets.local import LocalTarget

        return LocalTarget(cfg.runtime_url, cfg.model_cache, ArtifactPolicy.from_settings(cfg), cfg.serving.annotations,
                           token=platform_token(cfg.home))
    raise InvalidInput(f"deploy target {cfg.serving.target!r}: use local, kserve or deployment", field="serving.target")
