"""The Kubernetes backend through the real `kubernetes` client against a recording API server.

No cluster runs here, so a small HTTP server stands in for the API server: it records what
the client sends (server-side apply, get, delete, pod logs) and answers like Kubernetes.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from cascade.stores.sqlite import SqliteStore
from cascade.functions.training.job import TrainingJob
from cascade.functions.training.backends.kubernetes import KubernetesBackend, phase


class FakeAPIServer:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.objects: dict[str, dict[str, Any]] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _body(self) -> Any:
                raw = self.rfile.read(int(self.headers.get("content-length", 0)))
                return json.loads(raw) if raw else None

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode() if not isinstance(body, bytes) else body
                self.send_response(code)
                self.send_header("content-type", "application/json" if not isinstance(body, bytes) else "text/plain")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self, body: Any = None) -> str:
                server.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                return self.path.split("?")[0]

            def do_PATCH(self) -> None:  # noqa: N802
                body = self._body()
                path = self._record(body)
                server.objects[path] = body
                self._send(200, body)

            def do_GET(self) -> None:  # noqa: N802
                path = self._record()
                if path.endswith("/pods"):
                    self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {},
                                     "items": [{"metadata": {"name": "job-1-master-0"}}]})
                elif path.endswith("/log"):
                    self._send(200, b"epoch 1 loss 0.5\n")
                elif path in server.objects:
                    self._send(200, server.objects[path])
                else:
                    self._send(404, {"kind": "Status", "code": 404})

            def do_DELETE(self) -> None:  # noqa: N802
                path = self._record()
                server.objects.pop(path, None)
                self._send(200, {"kind": "Status", "status": "Success"})

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    server = FakeAPIServer()
    yield server
    server.http.shutdown()


def test_apply_status_logs_and_cancel(api: FakeAPIServer, tmp_path: Path) -> None:
    config = k8s.Configuration(host=api.url)
    store = SqliteStore(tmp_path / "state.db")
    backend = KubernetesBackend(k8s.ApiClient(config), store, namespace_prefix="team-")
    job = TrainingJob.from_spec("job-1", "vision", {"framework": "pytorch", "entrypoint": {"script": "/app/t.py"},
                                                    "workers": 2})
    job = TrainingJob(job.id, job.project, job.spec, {"image": "img:1", "limits": {"nvidia.com/gpu": "1"},
                                                      "nodeSelector": {"gpu-type": "T4"}})
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
