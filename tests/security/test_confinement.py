"""Confinement pieces on their own: the job user, artifact sources, the HTTP guard, the folder source."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.core.hashing import sha256_file
from cascade.core.httpguard import HTTPGuard
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.sources.folder import FolderSource
from cascade.functions.training.policy import drop_to
from cascade.serving import artifacts
from cascade.serving.artifacts import ArtifactPolicy, ArtifactRefused, ChecksumMismatch
from cascade.stores.sqlite import SqliteStore


def test_jobs_drop_to_the_configured_user_when_the_platform_is_root() -> None:
    options = drop_to("nobody")
    if os.geteuid() != 0:
        assert options == {}, "nothing to drop from"
        return
    uid = subprocess.run(["id", "-u"], capture_output=True, text=True, **options).stdout.strip()
    assert uid == "65534"
    assert drop_to("") == {}


@pytest.fixture
def redirector() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 that redirects every request to localhost:1 (off the allowlist)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("location", "http://169.254.169.254/latest/meta-data/")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/model.pt"
    server.shutdown()


def test_artifacts_come_only_from_the_roots_and_hosts_allowed(tmp_path: Path, redirector: str) -> None:
    root, cache = tmp_path / "artifacts", tmp_path / "cache"
    (root / "job-1").mkdir(parents=True)
    good = root / "job-1" / "model.pt"
    good.write_bytes(b"weights")
    outside = tmp_path / "private.key"
    outside.write_bytes(b"secret")
    outside.chmod(0o600)
    policy = ArtifactPolicy((root,), ("127.0.0.1",))
    with pytest.raises(ArtifactRefused):
        artifacts.fetch(outside.as_uri(), sha256_file(outside), cache, policy)
    link = root / "job-1" / "link.pt"
    link.symlink_to(outside)
    with pytest.raises(ArtifactRefused):
        artifacts.fetch(link.as_uri(), sha256_file(outside), cache, policy)
    with pytest.raises(ArtifactRefused):
        artifacts.fetch("http://169.254.169.254/latest/meta-data/", "0" * 64, cache, policy)
    with pytest.raises(ArtifactRefused, match="169.254.169.254"):
        artifacts.fetch(redirector, "0" * 64, cache, policy)
    with pytest.raises(ChecksumMismatch) as wrong:
        artifacts.fetch(good.as_uri(), "1" * 64, cache, policy)
    assert sha256_file(good) not in str(wrong.value), "a mismatch never tells what the bytes hash to"
    copy = artifacts.fetch(good.as_uri(), sha256_file(good), cache, policy)
    assert copy.read_bytes() == b"weights"
    assert copy.stat().st_mode & 0o777 == 0o600 and copy.parent.stat().st_mode & 0o777 == 0o700


def test_a_lora_adapters_base_model_must_lie_under_the_roots_too(tmp_path: Path) -> None:
    import json

    root = tmp_path / "artifacts"
    adapter, base = root / "job-2" / "adapter", root / "job-1" / "model"
    adapter.mkdir(parents=True)
    base.mkdir(parents=True)
    policy = ArtifactPolicy((root,))
    for named, allowed in [(str(base), True), (str(tmp_path / "elsewhere"), False), ("/etc", False),
                           ("meta-llama/Llama-2-7b-hf", False)]:
        (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": named}))
        if allowed:
            artifacts.check_base(adapter, "lora-adapter", policy)
        else:
            with pytest.raises(ArtifactRefused, match="base model"):
                artifacts.check_base(adapter, "lora-adapter", policy)
    artifacts.check_base(tmp_path, "torchscript", policy)  # other formats name no second artifact


async def _boom(scope: dict[str, Any], receive: Any, send: Any) -> None:
    raise RuntimeError("a bug")


def test_an_unhandled_error_is_a_counted_json_500() -> None:
    seen: list[tuple[int, str]] = []
    guard = HTTPGuard(_boom, hosts=["testserver"], max_body=10, on_error=lambda s, p: seen.append((s, p)))
    transport = httpx.ASGITransport(app=guard)  # type: ignore[arg-type]

    async def call() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return [await client.get("/x"), await client.post("/y", content=b"z" * 100)]

    import asyncio

    bug, big = asyncio.run(call())
    assert bug.status_code == 500 and bug.json()["error"] == "InternalError" and "a bug" not in bug.text
    assert big.status_code == 413
    assert seen == [(500, "/x"), (413, "/y")]


def test_the_folder_announces_no_links_and_survives_names_that_are_not_utf8(tmp_path: Path) -> None:
    inbox, outside = tmp_path / "inbox", tmp_path / "secret.txt"
    (inbox / "cats").mkdir(parents=True)
    outside.write_text("not yours")
    (inbox / "cats" / "link.txt").symlink_to(outside)
    (inbox / "cats").joinpath(os.fsdecode(b"bad-\xff.jpg")).write_bytes(b"x")
    (inbox / "cats" / "ok.jpg").write_bytes(b"y")
    bus, store = EmbeddedBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "state.db")
    source = FolderSource(inbox, bus, store, settle=0)
    published = source.scan()
    assert [e.get_data()["key"] for e in published] == ["cats/ok.jpg"]
    bus.close()


def test_the_dispatcher_operations_port_checks_the_host_too() -> None:
    from prometheus_client import CollectorRegistry

    from cascade.core.ports import free_port
    from cascade.events.dispatcher.operations import serve_operations
    from cascade.events.health import Health

    port = free_port()
    server = serve_operations("127.0.0.1", port, CollectorRegistry(), Health({}))
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert httpx.get(url).status_code == 200
        assert httpx.get(url, headers={"host": "attacker.example"}).status_code == 400
        assert httpx.get(url, headers={"origin": "http://attacker.example"}).status_code == 403
    finally:
        server.shutdown()


def test_a_job_names_only_files_of_its_own_output_and_workspace(tmp_path: Path) -> None:
    from cloudevents.http import CloudEvent

    from cascade.core.errors import InvalidInput
    from cascade.core.settings import Settings
    from cascade.functions.models import Models
    from cascade.functions.training.policy import JobPolicy

    cfg = Settings(home=tmp_path / "home")
    output = cfg.artifact_root / "job-1"
    output.mkdir(parents=True)
    (output / "model.pt").write_bytes(b"weights")
    models = Models(cfg)
    for file, registered in (("../../../../../../etc/hostname", False), ("model.pt", True)):
        models.store.put_record("job", "job-1", {"id": "job-1", "project": "p", "spec": {
            "framework": "pytorch", "model": {"name": f"m{int(registered)}", "file": file}}})
        event = CloudEvent({"type": "io.cascade.job.succeeded.v1", "source": "/t", "project": "p"},
                           {"jobId": "job-1", "artifactUri": output.as_uri(), "metrics": {}})
        assert bool(models.on_succeeded(event)) is registered, file
    assert [r["artifactUri"] for r in models.store.find_records("model-version")] == [(output / "model.pt").as_uri()]

    policy = JobPolicy.from_settings(cfg)
    workspace = policy.workspace("p")
    workspace.mkdir(parents=True)
    (workspace / "train.py").write_text("print(1)")
    (workspace / "escape.py").symlink_to(tmp_path / "elsewhere.py")
    (tmp_path / "elsewhere.py").write_text("print(2)")
    assert policy.script("p", "train.py") == (workspace / "train.py").resolve()
    with pytest.raises(InvalidInput, match="workspace"):
        policy.script("p", "escape.py")
