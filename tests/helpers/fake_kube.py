"""A recording Kubernetes API server for tests: no cluster runs here, so a small HTTP server
stands in. It records what the real ``kubernetes`` client sends (server-side apply, get,
delete, pods, logs), keeps the objects, and answers like the API server; a test (or
``on_apply``) writes the status conditions an operator would, as kwok or envtest users do.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client as k8s


class FakeAPIServer:
    """Records what the client sends and answers like Kubernetes; ``on_apply`` stands in for an operator."""

    def __init__(self, on_apply: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.on_apply = on_apply
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
                status = (server.objects.get(path) or {}).get("status")  # apply leaves status alone
                server.objects[path] = {**body, **({"status": status} if status else {})}
                if server.on_apply is not None:
                    server.on_apply(path, server.objects[path])
                self._send(200, server.objects[path])

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

    def api(self) -> k8s.ApiClient:
        return k8s.ApiClient(k8s.Configuration(host=self.url))

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
