"""The training backend plug-in point: the protocol (``base``), one module per backend, one factory.

``open_backend`` imports only the chosen backend, so the local default never loads the
``kubernetes`` client.
"""

from __future__ import annotations

from cascade.core.errors import InvalidInput
from cascade.core.settings import Settings
from cascade.functions.training.backends.base import Change, TrainingBackend, lifecycle_event
from cascade.scheduling.placement import Cluster
from cascade.stores import StateStore

__all__ = ["Change", "TrainingBackend", "lifecycle_event", "open_backend"]


def open_backend(cfg: Settings, store: StateStore) -> TrainingBackend:
    """The backend ``cfg.training.backend`` names, on ``store``; with clusters in the inventory, a router over it
    and one backend per cluster."""
    own = _backend(cfg, store, cfg.training.backend)
    if not cfg.training.inventory:
        return own
    from cascade.scheduling.placement import Inventory

    clusters = Inventory.load(cfg.training.inventory).clusters
    if not clusters:
        return own
    from cascade.functions.training.backends.clusters import ClusterRouter

    return ClusterRouter({"": own, **{name: _backend(cfg, store, c.backend, c) for name, c in clusters.items()}}, store)


def _backend(cfg: Settings, store: StateStore, kind: str, cluster: Cluster | None = None) -> TrainingBackend:
    if kind == "kubernetes":
        from cascade.core.credentials import platform_token
        from cascade.core.kube import api_client
        from cascade.functions.training.backends.kubernetes import KubernetesBackend

        if cluster is None:
            return KubernetesBackend(api_client(), store, cfg.training.namespace_prefix, platform_token(cfg.home))
        return KubernetesBackend(api_client(cluster.kubeconfig, cluster.context), store, cluster.namespace_prefix,
                                 platform_token(cfg.home), cluster=cluster.name)
    if kind == "local":
        from cascade.functions.training.backends.local import LocalBackend

        return LocalBackend(cfg.artifact_root, store, cfg.export())
    raise InvalidInput(f"training backend {kind!r}: use local or kubernetes", field="training.backend")
