"""The DeployTarget contract, written once and run against every target.

local: the runtime's model servers, really loading a tiny TorchScript model. kserve: a real
kube-apiserver with KServe's CRD (tests/helpers/kube.py), where a stand-in controller marks an
InferenceService Ready (or, for an artifact that cannot load, ModelLoadFailed) for the
generation it saw, as KServe's controller would. The contract: a
release serves, a canary gets its share, a version that cannot load is refused, and after a
restart the released versions serve again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from cascade.core.asgi import ServerThread
from cascade.core.credentials import platform_token
from cascade.core.hashing import sha256_file
from cascade.core.ports import free_port
from cascade.events.identity import Authenticator, Projects
from cascade.serving import kserve
from cascade.serving.artifacts import ArtifactPolicy
from cascade.serving.runtime.activator import Runtime
from cascade.serving.targets import DeployFailed, DeployTarget, Release
from cascade.serving.targets.deployment import DeploymentTarget
from cascade.serving.targets.kserve import KServeTarget
from cascade.serving.targets.local import LocalTarget
from cascade.stores.sqlite import SqliteStore
from tests.helpers import models
from tests.helpers.kube import Cluster, Operator, unique


class LocalDriver:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.server: ServerThread | None = None
        self.target: DeployTarget = self.restart()

    def restart(self) -> DeployTarget:
        """A new runtime (nothing loaded) and a target that talks to it: a restarted ``cascade up``."""
        if self.server is not None:
            self.server.stop()
        token = platform_token(self.tmp_path, create=True)  # the runtime's admin API takes only this
        auth = Authenticator(Projects(SqliteStore(self.tmp_path / "state.db")), token)
        rt = Runtime(self.tmp_path / f"run-{free_port()}", auth=auth, tick=0.05, model_grace=30)
        self.server = ServerThread(rt, port=free_port(), name="runtime").start()
        return LocalTarget(self.server.url, self.tmp_path / "cache", ArtifactPolicy((self.tmp_path,)),
                           {"autoscaling.knative.dev/window": "5s"}, token=token)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


class KServeDriver:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.prefix = cluster, unique("t") + "-"
        namespace = cluster.namespace(f"{self.prefix}team")
        self.operator = Operator(cluster, "serving.kserve.io", "v1beta1", "inferenceservices", namespace, self.decide)
        self.target = self.restart()

    @staticmethod
    def decide(obj: dict[str, Any]) -> dict[str, Any]:
        ok = "broken" not in kserve.storage_uri(obj)
        return {"conditions": [{"type": "Ready", "status": "True" if ok else "False",
                                **({} if ok else {"reason": "ModelLoadFailed", "message": "cannot load"})}]}

    def restart(self) -> DeployTarget:
        return KServeTarget(self.cluster.api, self.prefix, timeout=30, poll=0.05)

    def close(self) -> None:
        self.operator.stop()


class DeploymentDriver:
    """The plain Deployment target; a stand-in Deployment controller makes every replica available, except for
    an artifact called broken, whose rollout passes its progress deadline."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.prefix = cluster, unique("t") + "-"
        namespace = cluster.namespace(f"{self.prefix}team")
        self.operator = Operator(cluster, "apps", "v1", "deployments", namespace, self.decide)
        self.target = self.restart()

    @staticmethod
    def decide(obj: dict[str, Any]) -> dict[str, Any]:
        init = obj["spec"]["template"]["spec"]["initContainers"][0]
        if "broken" in init["args"][0]:
            return {"conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                                    "message": "ReplicaSet has timed out progressing."}]}
        replicas = int(obj["spec"].get("replicas") or 0)
        return {"replicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas,
                "updatedReplicas": replicas}

    def restart(self) -> DeployTarget:
        return DeploymentTarget(self.cluster.api, self.prefix, timeout=30, poll=0.05)

    def close(self) -> None:
        self.operator.stop()


DRIVERS = {"kserve": KServeDriver, "deployment": DeploymentDriver}


@pytest.fixture(params=[pytest.param("local", marks=pytest.mark.slow), "kserve", "deployment"])  # local loads models
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    d = LocalDriver(tmp_path) if request.param == "local" else DRIVERS[request.param](request.getfixturevalue("cluster"))
    yield d
    d.close()


def release(path: Path, version: str, canary: int | None = None) -> Release:
    return Release("m", version, path.as_uri(), sha256_file(path), "torchscript", "team", canary)


class TestDeployTargetContract:
    def test_a_release_serves_and_a_canary_gets_its_share(self, driver: Any, tmp_path: Path) -> None:
        deployed = driver.target.deploy(release(models.torchscript(tmp_path, bias=0.0), "1"))
        assert deployed.target == driver.target.name
        assert driver.target.serving("m", "team") == {"1": 100}
        driver.target.deploy(release(models.torchscript(tmp_path, bias=100.0), "2", canary=20))
        assert driver.target.serving("m", "team") == {"1": 80, "2": 20}
        driver.target.deploy(release(models.torchscript(tmp_path, bias=100.0), "2"))
        assert driver.target.serving("m", "team") == {"2": 100}

    def test_a_version_that_cannot_load_is_refused(self, driver: Any, tmp_path: Path) -> None:
        driver.target.deploy(release(models.torchscript(tmp_path), "1"))
        broken = tmp_path / "broken.pt"
        broken.write_bytes(b"not a model")
        with pytest.raises(DeployFailed):
            driver.target.deploy(release(broken, "2"))
        assert driver.target.serving("nobody", "team") == {}

    def test_after_a_restart_the_released_versions_serve_again(self, driver: Any, tmp_path: Path) -> None:
        first = release(models.torchscript(tmp_path), "1")
        driver.target.deploy(first)
        after = driver.restart()
        assert after.restore([first]) == []
        assert after.serving("m", "team") == {"1": 100}

    def test_withdrawing_returns_the_traffic_and_the_last_version_stops_serving(self, driver: Any, tmp_path: Path) -> None:
        driver.target.deploy(release(models.torchscript(tmp_path, bias=0.0), "1"))
        driver.target.deploy(release(models.torchscript(tmp_path, bias=100.0), "2", canary=20))
        assert driver.target.withdraw("m", "2", "team") == {"1": 100}, "the canary's share goes back"
        assert driver.target.withdraw("m", "2", "team") == {"1": 100}, "withdrawing it again changes nothing"
        driver.target.deploy(release(models.torchscript(tmp_path, bias=100.0), "3", canary=50))
        assert driver.target.withdraw("m", "1", "team") == {"3": 100}, "the previous withdrawn: the canary takes all"
        assert driver.target.withdraw("m", "3", "team") == {}
        assert driver.target.serving("m", "team") == {}


def test_the_deployment_target_splits_by_replicas_and_keeps_a_zero_canary_out_of_the_service(
        cluster: Cluster, tmp_path: Path) -> None:
    d = DeploymentDriver(cluster)
    try:
        d.target.deploy(release(models.torchscript(tmp_path, bias=0.0), "1"))
        d.target.deploy(release(models.torchscript(tmp_path, bias=100.0), "2", canary=20))
        namespace = f"{d.prefix}team"
        pods = {x.metadata.labels["cascade.io/version"]: x.spec.replicas
                for x in k8s.AppsV1Api(cluster.api).list_namespaced_deployment(namespace).items}
        assert pods == {"1": 4, "2": 1}, "a 20 % canary is one pod in five"
        d.target.deploy(release(models.torchscript(tmp_path, bias=50.0), "3", canary=0))
        deployment = k8s.AppsV1Api(cluster.api).read_namespaced_deployment("m-v3", namespace)
        service = k8s.CoreV1Api(cluster.api).read_namespaced_service("m", namespace)
        assert deployment.spec.template.metadata.labels["cascade.io/serves"] == "no"
        assert service.spec.selector["cascade.io/serves"] == "yes", "the service never selects a 0 % canary"
        assert d.target.serving("m", "team") == {"1": 100}, "a new canary replaces the old one, as on KServe"
    finally:
        d.close()


def test_a_version_being_scaled_keeps_serving(cluster: Cluster, tmp_path: Path) -> None:
    """Withdrawing a canary scales the previous version up (a new generation); until the Deployment controller
    has seen it, the version's pods still answer, so it still serves and a second withdraw changes nothing."""
    d = DeploymentDriver(cluster)
    try:
        d.target.deploy(release(models.torchscript(tmp_path, bias=0.0), "1"))
        d.target.deploy(release(models.torchscript(tmp_path, bias=100.0), "2", canary=20))
        d.operator.stop()  # the controller falls behind: no status for the scale that comes next
        assert d.target.withdraw("m", "2", "team") == {"1": 100}
        deployment = k8s.AppsV1Api(cluster.api).read_namespaced_deployment("m-v1", f"{d.prefix}team")
        assert deployment.spec.replicas == 1 and deployment.status.observed_generation < deployment.metadata.generation
        assert d.target.serving("m", "team") == {"1": 100}
        assert d.target.withdraw("m", "2", "team") == {"1": 100}
    finally:
        d.close()
