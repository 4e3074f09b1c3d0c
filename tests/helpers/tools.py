"""Real Label Studio and MinIO servers for the source tests, from the cache scripts/tools.sh fills.

Each Label Studio starts from a copy of a migrated template database (an admin with a legacy
API token), so two installs number their projects alike, as real separate installs do. A tool
that is not installed skips its tests with the command that installs it; under CI it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.core.ports import free_port
from tests.helpers.waiting import until

TOOLS = Path(os.environ.get("CASCADE_TOOLS_DIR", Path.home() / ".cache" / "cascade"))
LS_TOKEN = "0123456789abcdef0123456789abcdef01234567"  # the template's admin (scripts/tools.sh)
CHOICES = ('<View><Text name="t" value="$text"/><Choices name="c" toName="t">'
           '<Choice value="cat"/><Choice value="dog"/></Choices></View>')


def need(path: Path, tool: str) -> None:
    if path.exists():
        return
    message = f"{tool} is not installed in {TOOLS}: run scripts/tools.sh install"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _wait(proc: subprocess.Popen[bytes], url: str, log: Path, timeout: float, **kwargs: Any) -> None:
    """Until ``url`` answers 200; fails at once if ``proc`` exits, or after ``timeout`` (the log says why)."""
    def answers() -> bool:
        assert proc.poll() is None, f"exited with {proc.returncode}: {log.read_text()[-2000:]}"
        try:
            return httpx.get(url, timeout=2, **kwargs).status_code == 200
        except httpx.HTTPError:
            return False

    if not until(answers, timeout, interval=0.2):
        pytest.fail(f"{url} did not answer within {timeout:g}s: {log.read_text()[-2000:]}")


@dataclass
class LabelStudio:
    """One Label Studio install and the calls a labelling team makes through its REST API."""

    url: str
    proc: subprocess.Popen[bytes]

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        reply = httpx.request(method, self.url + path, headers={"Authorization": f"Token {LS_TOKEN}"}, timeout=30,
                              **kwargs)
        assert reply.status_code < 300, f"{method} {path}: {reply.status_code} {reply.text[:500]}"
        return reply.json() if reply.content else None

    def project(self, title: str, tasks: int, **settings: Any) -> tuple[int, list[int]]:
        """A project with ``tasks`` text tasks; its id and its task ids."""
        pid = int(self.api("POST", "/api/projects/", json={"title": title, "label_config": CHOICES, **settings})["id"])
        self.api("POST", f"/api/projects/{pid}/import", json=[{"text": f"item {i}"} for i in range(tasks)])
        return pid, sorted(t["id"] for t in self.api("GET", f"/api/tasks/?project={pid}&page_size=1000")["tasks"])

    def annotate(self, task: int, *, skip: bool = False) -> int:
        result = [] if skip else [{"from_name": "c", "to_name": "t", "type": "choices", "value": {"choices": ["cat"]}}]
        return int(self.api("POST", f"/api/tasks/{task}/annotations/", json={"result": result, "was_cancelled": skip})["id"])

    def counts(self, pid: int) -> tuple[int, int]:
        info = self.api("GET", f"/api/projects/{pid}")
        return int(info["finished_task_number"]), int(info["task_number"])

    def webhooks(self) -> list[dict[str, Any]]:
        return list(self.api("GET", "/api/webhooks/"))


@contextmanager
def label_studio(home: Path) -> Iterator[LabelStudio]:
    """A Label Studio install in ``home``, from the template; stopped after."""
    venv, template = TOOLS / "label-studio" / "venv", TOOLS / "label-studio" / "template"
    need(template / ".ready", "Label Studio")
    shutil.copytree(template, home)
    port, log = free_port(), home / "server.log"
    env = {**os.environ, "LABEL_STUDIO_BASE_DATA_DIR": str(home), "SSRF_PROTECTION_ENABLED": "false",
           "SENTRY_DSN": "", "LATEST_VERSION_CHECK": "false", "COLLECT_ANALYTICS": "false"}
    with log.open("w") as out:
        proc = subprocess.Popen([str(venv / "bin" / "label-studio"), "start", "--no-browser", "--host", "127.0.0.1",
                                 "--port", str(port), "--enable-legacy-api-token"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    server = LabelStudio(f"http://127.0.0.1:{port}", proc)
    try:
        _wait(proc, f"{server.url}/api/projects/", log, 120, headers={"Authorization": f"Token {LS_TOKEN}"})
        yield server
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@dataclass
class MinIO:
    endpoint: str
    proc: subprocess.Popen[bytes]
    user: str = "cascade-admin"
    password: str = "cascade-admin-secret"

    def client(self) -> Any:
        from minio import Minio

        return Minio(self.endpoint, access_key=self.user, secret_key=self.password, secure=False)


@contextmanager
def minio(home: Path, webhook: str, token: str) -> Iterator[MinIO]:
    """A MinIO server whose webhook target ``cascade`` posts to ``webhook`` with ``token``; notifications
    that cannot be delivered wait in a queue folder and are sent again (MinIO's own retry)."""
    binary = TOOLS / "minio" / "bin" / "minio"
    need(binary, "MinIO")
    port, console, log = free_port(), free_port(), home / "server.log"
    home.mkdir(parents=True)
    server = MinIO(f"127.0.0.1:{port}", None)  # type: ignore[arg-type]
    env = {**os.environ, "MINIO_ROOT_USER": server.user, "MINIO_ROOT_PASSWORD": server.password,
           "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_NOTIFY_WEBHOOK_ENABLE_CASCADE": "on",
           "MINIO_NOTIFY_WEBHOOK_ENDPOINT_CASCADE": webhook, "MINIO_NOTIFY_WEBHOOK_AUTH_TOKEN_CASCADE": token,
           "MINIO_NOTIFY_WEBHOOK_QUEUE_DIR_CASCADE": str(home / "queue")}
    with log.open("w") as out:
        server.proc = subprocess.Popen([str(binary), "server", str(home / "data"), "--address", server.endpoint,
                                        "--console-address", f"127.0.0.1:{console}"], env=env, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait(server.proc, f"http://{server.endpoint}/minio/health/live", log, 60)
        yield server
    finally:
        server.proc.terminate()
        server.proc.wait(timeout=30)


def notify(client: Any, bucket: str, events: list[str]) -> None:
    """Send ``bucket``'s notifications of ``events`` to the ``cascade`` webhook target (``mc event add``)."""
    from minio.notificationconfig import NotificationConfig, QueueConfig

    client.set_bucket_notification(bucket, NotificationConfig(
        queue_config_list=[QueueConfig(queue="arn:minio:sqs::CASCADE:webhook", events=events)]))
