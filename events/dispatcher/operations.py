"""The dispatcher's operations port: Prometheus ``/metrics`` and ``/readyz`` (bus and state store).

A plain threading HTTP server (the dispatcher has no event loop), serving in a daemon thread.
Like every Cascade server it answers only a ``Host`` that names it (DNS rebinding) and no
browser ``Origin`` from elsewhere; it takes no body and sends no secrets.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from cascade.core.httpguard import allowed_hosts, host_refusal
from cascade.events.health import Health


def serve_operations(host: str, port: int, registry: CollectorRegistry, health: Health,
                     hosts: Sequence[str] = ()) -> ThreadingHTTPServer:
    names = allowed_hosts(host, hosts)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            path = self.path.split("?")[0]
            refused = host_refusal(names, self.headers.get("host", ""), self.headers.get("origin"))
            if refused is not None:
                self._send(refused[0], "application/json", json.dumps({"error": refused[1], "message": refused[2],
                                                                        "field": refused[3]}).encode())
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
            elif path == "/readyz":
                ready, body = health.report()
                self._send(200 if ready else 503, "application/json", json.dumps(body).encode())
            elif path == "/healthz":
                self._send(200, "application/json", b'{"status": "ok"}')
            else:
                self._send(404, "text/plain", b"GET /metrics, /readyz or /healthz")

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="dispatcher-operations", daemon=True).start()
    return server
