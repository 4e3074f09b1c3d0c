"""The real Kubernetes control plane of the cluster-form tests (etcd + kube-apiserver, scripts/services.sh).

No controllers run, so a test plays the operators (writes their status) and the
controller-manager (creates a namespace's ``default`` ServiceAccount) itself, as envtest and
kwok users do. Each test works in namespaces of its own, named uniquely. A missing control
plane fails the test with the command that starts it, as Kafka and Redis do.
"""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as kube_config
from kubernetes import watch as kube_watch

TOOLS = Path(os.environ.get("CASCADE_TOOLS_DIR", Path.home() / ".cache" / "cascade"))
KUBECONFIG = TOOLS / "kube" / "run" / "kubeconfig"  # written by scripts/services.sh kube
KUBECTL = TOOLS / "kube" / "v1.34.4" / "bin" / "kubectl"
log = logging.getLogger(__name__)


@dataclass
class Cluster:
    kubeconfig: Path
    api: k8s.ApiClient

    @property
    def core(self) -> k8s.CoreV1Api:
        return k8s.CoreV1Api(self.api)

    @property
    def custom(self) -> k8s.CustomObjectsApi:
        return k8s.CustomObjectsApi(self.api)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(KUBECTL), *args], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        if check and done.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr or done.stdout}")
        return done

    def namespace(self, name: str) -> str:
        """A namespace with its ``default`` ServiceAccount (the controller-manager's job, which does not run)."""
        self.core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
        self.core.create_namespaced_service_account(name, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="default")))
        return name

    def token_for(self, namespace: str, account: str) -> str:
        """A real bound token of a ServiceAccount (TokenRequest), as a pod would mount it."""
        answer = self.core.create_namespaced_service_account_token(
            account, namespace, k8s.AuthenticationV1TokenRequest(spec=k8s.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc"], expiration_seconds=3600)))
        return str(answer.status.token)

    def client_as(self, token: str) -> k8s.ApiClient:
        """An API client holding ``token`` instead of the admin's: RBAC decides what it may do."""
        config = k8s.Configuration()
        kube_config.load_kube_config(str(self.kubeconfig), client_configuration=config)  # type: ignore[no-untyped-call]
        config.api_key, config.api_key_prefix = {"BearerToken": f"Bearer {token}"}, {}
        config.refresh_api_key_hook = None
        return k8s.ApiClient(config)

    def status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        """Write an object's status subresource, as its operator would."""
        group, _, version = obj["apiVersion"].rpartition("/")
        from cascade.functions.training.kinds import plural
        self.custom.patch_namespaced_custom_object_status(
            group, version, obj["metadata"]["namespace"], plural(obj["kind"]), obj["metadata"]["name"],
            {"status": status})


class Operator:
    """A stand-in for an operator's controller: watches one kind in one namespace and writes the status
    ``decide(obj)`` returns (None: leave it), with ``observedGeneration`` as real controllers do.

    Like an informer it lists first (a read the API server answers from etcd) and acts on every object,
    then watches from the list's resource version until ``RESYNC`` seconds have passed, and lists again:
    an event a watch never delivered is acted on within one resync. (The API server's watch cache can
    lag behind a CRD created moments before; a watch then fails with "Too large resource version"
    until it catches up, while the list already has the object.)"""

    RESYNC = 2

    def __init__(self, cluster: Cluster, group: str, version: str, plural: str, namespace: str,
                 decide: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        self.cluster, self.where, self.decide = cluster, (group, version, namespace, plural), decide
        self._stop = threading.Event()
        self._watch = kube_watch.Watch()
        self._thread = threading.Thread(target=self._run, name=f"operator-{plural}", daemon=True)
        self._thread.start()

    def _act(self, custom: k8s.CustomObjectsApi, obj: dict[str, Any]) -> None:
        group, version, namespace, plural = self.where
        status = self.decide(obj)
        meta = obj["metadata"]
        if status is not None and (obj.get("status") or {}).get("observedGeneration") != meta["generation"]:
            custom.patch_namespaced_custom_object_status(
                group, version, namespace, plural, meta["name"],
                {"status": {**status, "observedGeneration": meta["generation"]}})

    def _run(self) -> None:
        group, version, namespace, plural = self.where
        custom = k8s.CustomObjectsApi(self.cluster.api)
        while not self._stop.is_set():
            try:
                listed = custom.list_namespaced_custom_object(group, version, namespace, plural)
                for obj in listed["items"]:
                    self._act(custom, obj)
                for event in self._watch.stream(custom.list_namespaced_custom_object, group, version, namespace,
                                                plural, resource_version=listed["metadata"]["resourceVersion"],
                                                timeout_seconds=self.RESYNC):
                    if event["type"] == "DELETED" or self._stop.is_set():
                        continue
                    self._act(custom, event["object"])
            except Exception as exc:  # noqa: BLE001 - a conflict, a lagging watch cache, a closed watch
                log.warning("stand-in operator for %s: %s; listing again", plural, exc)
                if self._stop.wait(0.2):
                    return

    def stop(self) -> None:
        self._stop.set()
        self._watch.stop()
        self._thread.join(15)


def unique(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(3)}"


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if not KUBECONFIG.exists() or not KUBECTL.exists():
        pytest.fail("no Kubernetes control plane: run scripts/tools.sh install && scripts/services.sh kube")
    api = kube_config.new_client_from_config(str(KUBECONFIG))  # type: ignore[no-untyped-call]
    try:
        k8s.VersionApi(api).get_code()
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"the Kubernetes control plane in {KUBECONFIG} does not answer ({exc}): "
                    "run scripts/services.sh kube")
    yield Cluster(KUBECONFIG, api)
    api.close()
