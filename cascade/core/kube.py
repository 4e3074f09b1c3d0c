"""One way to reach the Kubernetes API: in a pod its service account, elsewhere the kubeconfig.

Used by the Kubernetes training backend and the KServe deploy target, so both work from a
laptop and from a function's pod (where there is no kubeconfig file). ``explain`` turns the
API server's refusals into Cascade's errors with the server's own words.
"""

from __future__ import annotations

import json
import os

from kubernetes import client as k8s
from kubernetes import config as kube_config

from cascade.core.errors import CascadeError, PermanentError, RetryableError


def explain(what: str, exc: Exception) -> CascadeError:
    """The API server's own message (``Status.message``); permanent for a 4xx it will answer again, retryable
    for the rest (5xx, 408, 409, 429, no answer at all)."""
    if not isinstance(exc, k8s.ApiException):
        return RetryableError(f"{what}: the Kubernetes API server did not answer: {exc}")
    try:
        message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        message = str(exc.reason)
    status = int(exc.status or 0)
    text = f"{what}: {status} {exc.reason}: {message}"
    return PermanentError(text) if 400 <= status < 500 and status not in (408, 409, 429) else RetryableError(text)


def api_client(config_file: str = "", context: str = "") -> k8s.ApiClient:
    """A client for the pod's service account, or for a kubeconfig (``config_file``/``context`` name one cluster
    of several; by default $KUBECONFIG or ~/.kube/config and its current context)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not config_file:
        try:
            kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
            return k8s.ApiClient()
        except kube_config.ConfigException:
            pass
    try:
        return kube_config.new_client_from_config(  # type: ignore[no-untyped-call,no-any-return]
            config_file=config_file or None, context=context or None)
    except (kube_config.ConfigException, OSError) as exc:
        raise PermanentError(f"no Kubernetes configuration{f' in {config_file}' if config_file else ''}: {exc}; set "
                             "KUBECONFIG (or the cluster's kubeconfig in the inventory) or run in a pod with a "
                             "service account") from exc


def list_nodes(api: k8s.ApiClient | None = None) -> list[dict[str, object]]:
    """Every node as the API returns it (JSON field names), for the scheduler's discovery."""
    api = api or api_client()
    try:
        nodes = k8s.CoreV1Api(api).list_node()
    except Exception as exc:  # noqa: BLE001 - ApiException or the connection's own error, both explained
        raise explain("list the nodes", exc) from exc
    return [dict(n) for n in api.sanitize_for_serialization(nodes)["items"]]  # type: ignore[no-untyped-call]
