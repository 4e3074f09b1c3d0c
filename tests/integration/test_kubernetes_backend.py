"""The Kubernetes backend through the real `kubernetes` client against a recording API server.

No cluster runs here, so a recording API server (tests/helpers/fake_kube.py) stands in. The
backend's shared behaviour is in tests/contract/test_training_backend_contract.py; this file
checks the wire: paths, field manager, apply content type, and every operator's status shape.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from cascade.functions.training.backends.kubernetes import KubernetesBackend, phase
from cascade.functions.training.job import TrainingJob
from cascade.scheduling.placement import PodPlacement
from cascade.stores.sqlite import SqliteStore
from tests.helpers.fake_kube import FakeAPIServer


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer()
    yield server
    server.close()


def test_apply_status_logs_and_cancel(api: FakeAPIServer, tmp_path: Path) -> None:
    config = k8s.Configuration(host=api.url)
    store = SqliteStore(tmp_path / "state.db")
    backend = KubernetesBackend(k8s.ApiClient(config), store, namespace_prefix="team-")
    job = TrainingJob.from_spec("job-1", "vision", {"framework": "pytorch", "entrypoint": {"script": "/app/t.py"},
                                                    "workers": 2})
    job = TrainingJob(job.id, job.project, job.spec, PodPlacement(image="img:1", limits={"nvidia.com/gpu": "1"},
                                                                  node_selector={"gpu-type": "T4"}))
    backend.launch(job, {})
    method, path, headers, body = api.requests[0]
    assert method == "PATCH"
    assert path.split("?")[0] == "/apis/kubeflow.org/v1/namespaces/team-vision/pytorchjobs/job-1"
    assert "fieldManager=cascade" in path and "force=true" in path
    assert headers["content-type"] == "application/apply-patch+yaml"
    assert body["kind"] == "PyTorchJob" and body["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    record = store.get_record("job", "job-1")
    assert record is not None and record["status"] == "launching" and record["resource"]["namespace"] == "team-vision"

    api.objects[path.split("?")[0]]["status"] = {"conditions": [
        {"type": "Created", "status": "True"}, {"type": "Running", "status": "False"},
        {"type": "Succeeded", "status": "True"}]}
    assert backend.status("job-1") == "succeeded"
    assert "epoch 1 loss" in backend.logs("job-1")
    assert any(r[1].startswith("/api/v1/namespaces/team-vision/pods?labelSelector=cascade.io") for r in api.requests)
    backend.cancel("job-1")
    assert api.requests[-1][0] == "DELETE"
    assert store.get_record("job", "job-1")["status"] == "cancelled"  # type: ignore[index]


@pytest.mark.parametrize("status, expected", [
    ({"conditions": [{"type": "Failed", "status": "True"}]}, "failed"),
    ({"state": {"phase": "Completed"}}, "succeeded"),
    ({"jobStatus": "FAILED"}, "failed"),
    ({"applicationState": {"state": "COMPLETED"}}, "succeeded"),
    ({"conditions": [{"type": "Running", "status": "True"}]}, "running"),
    ({}, "running"),
])
def test_phase_reads_every_operators_status(status: dict[str, Any], expected: str) -> None:
    assert phase({"status": status}) == expected
