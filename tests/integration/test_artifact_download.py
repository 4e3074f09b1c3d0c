"""Artifact downloads over a thin link: a bandwidth limit, a resumed partial file, the cache that
makes a second fetch free, and the credential kept from other hosts (a real HTTP server with ranges)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cascade.serving import artifacts
from cascade.serving.artifacts import ArtifactPolicy

BLOB = os.urandom(300_000)
SHA = hashlib.sha256(BLOB).hexdigest()


class Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                server.requests.append({k.lower(): v for k, v in self.headers.items()})
                if self.path == "/elsewhere":
                    self.send_response(302)
                    self.send_header("location", f"http://localhost:{self.server.server_address[1]}/blob")
                    self.end_headers()
                    return
                first = int(self.headers.get("range", "bytes=0-")[6:].split("-")[0])
                self.send_response(206 if first else 200)
                if first:
                    self.send_header("content-range", f"bytes {first}-{len(BLOB) - 1}/{len(BLOB)}")
                self.send_header("content-length", str(len(BLOB) - first))
                self.end_headers()
                self.wfile.write(BLOB[first:])

            def log_message(self, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.http.shutdown()


def test_a_limited_download_resumes_and_is_never_repeated(server: Server, tmp_path: Path) -> None:
    policy = ArtifactPolicy((tmp_path,), ("127.0.0.1",))
    (tmp_path / "cache" / SHA).mkdir(parents=True)
    (tmp_path / "cache" / SHA / "m.pt.part").write_bytes(BLOB[:100_000])  # what a cut link left
    started = time.monotonic()
    path, received = artifacts.download(f"{server.url}/blob", SHA, tmp_path / "cache", policy, name="m.pt",
                                        headers={"authorization": "Bearer edge"}, rate=400_000)
    took = time.monotonic() - started
    assert path.read_bytes() == BLOB and received == 200_000, "only the missing bytes came"
    assert server.requests[-1]["range"] == "bytes=100000-" and server.requests[-1]["authorization"] == "Bearer edge"
    assert took >= 0.45, f"200 kB at 400 kB/s took {took:.2f}s"
    again = artifacts.download(f"{server.url}/blob", SHA, tmp_path / "cache", policy, name="m.pt")
    assert again == (path, 0) and len(server.requests) == 1, "the cache answered"


def test_the_credential_does_not_follow_a_redirect_to_another_host(server: Server, tmp_path: Path) -> None:
    policy = ArtifactPolicy((tmp_path,), ("127.0.0.1", "localhost"))
    _, received = artifacts.download(f"{server.url}/elsewhere", SHA, tmp_path / "cache", policy,
                                     headers={"authorization": "Bearer edge"})
    assert received == len(BLOB)
    assert "authorization" in server.requests[0] and "authorization" not in server.requests[1]
