"""One way to reach the Kubernetes API: in a pod its service account, elsewhere the kubeconfig.

Used by the Kubernetes training backend and the KServe deploy target, so both work from a
laptop and from a function's pod (where there is no kubeconfig file).
"""

from __future__ import annotations

import os

from kubernetes import client as k8s
from kubernetes import config as kube_config

from cascade.core.errors import PermanentError


def api_client() -> k8s.ApiClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
            return k8s.ApiClient()
        except kube_config.ConfigException:
            pass
    try:
        return kube_config.new_client_from_config()  # type: ignore[no-untyped-call,no-any-return]
    except (kube_config.ConfigException, OSError) as exc:
        raise PermanentError(f"no Kubernetes configuration: {exc}; set KUBECONFIG or run in a pod "
                             "with a service account") from exc
