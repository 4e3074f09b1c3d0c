"""The training backend plug-in point: the protocol (``base``), one module per backend, one factory.

``open_backend`` imports only the chosen backend, so the local default never loads the
``kubernetes`` client.
"""

from __future__ import annotations

from cascade.core.errors import InvalidInput
from cascade.core.settings import Settings
from cascade.functions.training.backends.base import Change, TrainingBackend, lifecycle_event
from cascade.stores import StateStore

__all__ = ["Change", "TrainingBackend", "lifecycle_event", "open_backend"]


def open_backend(cfg: Settings, store: StateStore) -> TrainingBackend:
    """The backend ``cfg.training.backend`` names, on ``store``."""
    if cfg.training.backend == "kubernetes":
        from cascade.core.credentials import platform_token
        from cascade.core.kube import api_client
        from cascade.functions.training.backends.kubernetes import KubernetesBackend

        return KubernetesBackend(api_client(), store, cfg.training.namespace_prefix, platform_token(cfg.home))
    if cfg.training.backend == "local":
        from cascade.functions.training.backends.local import LocalBackend

        return LocalBackend(cfg.artifact_root, store, cfg.export())
    raise InvalidInput(f"training backend {cfg.training.backend!r}: use local or kubernetes", field="training.backend")
