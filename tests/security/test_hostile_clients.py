"""A hostile client against `cascade up` on the embedded defaults: every attack is refused.

One platform for the module, run as a user runs it, with a secret in its environment, jobs
dropped to ``nobody`` when it runs as root, and a 1 s header timeout. The attacker holds a
project token of another project (``mallory``), a token with only some scopes, or nothing;
where the machine allows it, a second local uid (``setpriv``) tries the files and the ports.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cascade.events.identity import Projects
from cascade.functions.training.policy import drop_to
from cascade.stores.sqlite import SqliteStore
from tests.helpers.platform import Running, cascade_up
from tests.helpers.waiting import eventually

ENV_DUMP = """import json, os, sys
out = os.environ["CASCADE_OUTPUT_DIR"]
with open(os.path.join(out, "metrics.json"), "w") as f:
    json.dump({"uid": os.getuid()}, f)
with open(os.path.join(out, "env.json"), "w") as f:
    json.dump(dict(os.environ), f)
"""


def nobody_runs_python() -> bool:
    """Whether jobs can be dropped to ``nobody`` here: root, and an interpreter that user may execute
    (a Python under /root, as pyenv installs it, is not)."""
    if os.geteuid() != 0:
        return False
    try:
        return subprocess.run([sys.executable, "-c", "1"], **drop_to("nobody")).returncode == 0
    except PermissionError:
        return False


class Attack:
    def __init__(self, running: Running, tokens: dict[str, str], shared: Path) -> None:
        self.p, self.tokens, self.shared = running, tokens, shared

    def h(self, who: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[who]}"} if who in self.tokens else {}

    def job(self, spec: dict[str, Any], who: str = "owner") -> httpx.Response:
        return httpx.post(f"{self.p.gateway}/v1/jobs", json={"kind": "training", "spec": spec}, headers=self.h(who))

    def event(self, family: str, data: dict[str, Any], who: str, **extra: str) -> httpx.Response:
        headers = {"ce-specversion": "1.0", "ce-id": uuid.uuid4().hex, "ce-source": "/attacker",
                   "ce-type": f"io.cascade.{family}.v1", "content-type": "application/json", **extra, **self.h(who)}
        return httpx.post(f"{self.p.gateway}/events", headers=headers, json=data)


@pytest.fixture(scope="module")
def attack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attack]:
    home = tmp_path_factory.mktemp("secure") / "home"
    shared = Path(tempfile.mkdtemp(prefix="cascade-jobs-"))  # traversable by the unprivileged job user
    shared.chmod(0o755)
    for folder in ("workspaces/default", "artifacts"):
        (shared / folder).mkdir(parents=True)
        (shared / folder).chmod(0o755)
    (shared / "workspaces").chmod(0o755)
    (shared / "workspaces/default/dump.py").write_text(ENV_DUMP)
    (shared / "workspaces/default/dump.py").chmod(0o644)
    env = {"CASCADE_SECRET_HF_TOKEN": "hf-s3cr3t", "CASCADE_GATEWAY__CVAT_SECRET": "cvat-s3cr3t",
           "CASCADE_SECURITY__HEADER_TIMEOUT_SECONDS": "1", "CASCADE_TRAINING__WORKSPACES": str(shared / "workspaces"),
           "CASCADE_TRAINING__ARTIFACTS": str(shared / "artifacts")}
    if nobody_runs_python():
        env["CASCADE_TRAINING__RUN_AS"] = "nobody"
    try:
        with cascade_up(home, **env) as running:
            projects = Projects(SqliteStore(home / "state.db"))
            projects.create_project("mallory")
            tokens = {"owner": running.token, "mallory": projects.create_token("mallory"),
                      "reader": projects.create_token("default", scopes=["read"]),
                      "platform": running.admin["authorization"].removeprefix("Bearer ")}
            yield Attack(running, tokens, shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_the_runtime_admin_api_and_functions_take_only_the_platform_credential(attack: Attack) -> None:
    rt = attack.p.runtime
    evil = {"artifact": "/tmp/evil.pkl", "format": "sklearn"}
    for who, status in (("nobody", 401), ("owner", 403), ("mallory", 403)):
        assert httpx.put(f"{rt}/_runtime/models/x/versions/1", json=evil, headers=attack.h(who)).status_code == status
        assert httpx.get(f"{rt}/_runtime/services", headers=attack.h(who)).status_code == status
        launch = httpx.post(f"{rt}/functions/launch-training", headers=attack.h(who), json={"jobId": "x"})
        assert launch.status_code == status, launch.text
    assert httpx.get(f"{rt}/_runtime/services", headers=attack.h("platform")).status_code == 200
    relative = httpx.put(f"{rt}/_runtime/models/x/versions/1", headers=attack.h("platform"),
                         json={"artifact": "evil.pkl", "format": "sklearn"})
    assert relative.status_code == 400, "only an absolute path of a verified copy"


def test_every_server_checks_the_host_and_origin(attack: Attack) -> None:
    for url in (attack.p.gateway + "/healthz", attack.p.runtime + "/healthz", attack.p.dashboard + "/"):
        assert httpx.get(url).status_code == 200
        rebound = httpx.get(url, headers={"host": "attacker.example"})
        assert rebound.status_code == 400 and rebound.json()["field"] == "host", url
        cross = httpx.get(url, headers={"origin": "http://attacker.example"})
        assert cross.status_code == 403 and cross.json()["field"] == "origin", url


def test_project_tokens_publish_only_their_own_kinds_of_event(attack: Attack) -> None:
    released = {"model": "m", "version": "1", "artifactUri": "file:///etc/hostname", "sha256": "0" * 64,
                "format": "sklearn"}
    for family, data in (("model.released", released), ("job.submitted", {"jobId": "job-1", "spec": {}}),
                         ("job.succeeded", {"jobId": "job-1"}), ("edge.heartbeat", {"cluster": "c"})):
        reply = attack.event(family, data, "owner")
        assert reply.status_code == 403 and reply.json()["field"] == "/type", (family, reply.text)
    uploaded = {"dataset": "d", "uri": "file:///tmp/d/a", "size": 1, "origin": "api"}
    assert attack.event("dataset.uploaded", uploaded, "owner").status_code == 202
    into_other = attack.event("dataset.uploaded", uploaded, "mallory", **{"ce-project": "default"})
    assert into_other.status_code == 403 and into_other.json()["field"] == "/project"
    no_project = attack.event("dataset.uploaded", uploaded, "platform")
    assert no_project.status_code == 400, "the platform names the project of what it publishes"
    other = attack.job({"framework": "pytorch", "entrypoint": {"script": "dump.py"}, "project": "default"}, "mallory")
    assert other.status_code == 403 and other.json()["field"] == "/spec/project"


def test_scopes_limit_what_a_token_may_do(attack: Attack) -> None:
    uploaded = {"dataset": "d", "uri": "file:///tmp/d/a", "size": 1, "origin": "api"}
    assert attack.event("dataset.uploaded", uploaded, "reader").status_code == 403
    spec = {"framework": "pytorch", "entrypoint": {"script": "dump.py"}}
    assert attack.job(spec, "reader").status_code == 403
    assert httpx.get(f"{attack.p.gateway}/v1/jobs", headers=attack.h("reader")).status_code == 200
    infer = httpx.post(f"{attack.p.runtime}/v1/models/m:predict", json={"instances": [[1]]}, headers=attack.h("reader"))
    assert infer.status_code == 403 and "infer" in infer.json()["message"]


def test_a_revoked_token_is_refused_everywhere(attack: Attack) -> None:
    projects = Projects(SqliteStore(Path(attack.p.env["CASCADE_HOME"]) / "state.db"))
    token = projects.create_token("default", "to revoke")
    headers = {"authorization": f"Bearer {token}"}
    assert httpx.get(f"{attack.p.gateway}/v1/jobs", headers=headers).status_code == 200
    assert httpx.get(f"{attack.p.dashboard}/api/snapshot", headers=headers).status_code == 200
    [record] = [t for t in projects.tokens("default") if t["description"] == "to revoke"]
    projects.revoke(record["id"])
    eventually(lambda: httpx.get(f"{attack.p.gateway}/v1/jobs", headers=headers).status_code == 401, 10,
               "the gateway refusing the revoked token (its cache lasts 5 s)")
    eventually(lambda: httpx.get(f"{attack.p.dashboard}/api/snapshot", headers=headers).status_code == 401, 10,
               "the dashboard refusing it")


def test_jobs_run_only_workspace_scripts_and_allowlisted_modules_within_caps(attack: Attack) -> None:
    bad = [({"script": "-c", "args": ["import os; os.system('id')"]}, "/spec/entrypoint/script"),
           ({"script": "/etc/passwd"}, "/spec/entrypoint/script"),
           ({"script": "../../home/x.py"}, "/spec/entrypoint/script"),
           ({"module": "os"}, "/spec/entrypoint/module"),
           ({"module": "pip", "args": ["install", "x"]}, "/spec/entrypoint/module")]
    for entry, field in bad:
        reply = attack.job({"framework": "pytorch", "entrypoint": entry})
        assert reply.status_code == 422 and reply.json()["field"] == field, (entry, reply.text)
    for key, value in (("workers", 100000), ("procsPerWorker", 1000), ("retries", 100), ("timeoutSeconds", 10**7)):
        reply = attack.job({"framework": "pytorch", "entrypoint": {"script": "dump.py"}, key: value})
        assert reply.status_code == 422 and reply.json()["field"] == f"/spec/{key}", (key, reply.text)


def test_a_job_gets_only_the_secrets_it_names_and_runs_unprivileged(attack: Attack) -> None:
    envs = []
    for secrets in ([], ["hf-token"]):
        reply = attack.job({"framework": "pytorch", "entrypoint": {"script": "dump.py"}, "secrets": secrets})
        assert reply.status_code == 202, reply.text
        job_id = reply.json()["jobId"]
        dump = attack.shared / "artifacts" / job_id / "env.json"

        def status() -> str:
            return str(httpx.get(f"{attack.p.gateway}/v1/jobs/{job_id}", headers=attack.h("owner")).json()["status"])

        eventually(lambda: status() in ("succeeded", "failed"), 90, f"job {job_id} ending")
        logs = "".join(p.read_text() for p in (attack.shared / "artifacts" / job_id).rglob("*.log"))
        assert status() == "succeeded", logs[-3000:]
        envs.append(json.loads(dump.read_text()))
        if attack.p.env.get("CASCADE_TRAINING__RUN_AS"):
            assert json.loads((dump.parent / "metrics.json").read_text())["uid"] == 65534, "the job ran as nobody"
            assert envs[-1]["HOME"] == str(attack.shared / "artifacts" / job_id)
    plain, named = envs
    for env in envs:
        text = json.dumps(env)
        assert "cvat-s3cr3t" not in text and "CASCADE_SECRET_" not in text and "CASCADE_STATE" not in text
        assert "platform.token" not in text and "casp_" not in text
    assert "HF_TOKEN" not in plain and named["HF_TOKEN"] == "hf-s3cr3t"


def test_the_dashboard_shows_a_token_its_own_project_only(attack: Attack) -> None:
    api = f"{attack.p.dashboard}/api/snapshot"
    assert httpx.get(api).status_code == 401
    uploaded = {"dataset": "secret-plans", "uri": "file:///tmp/s/a", "size": 1, "origin": "api"}
    assert attack.event("dataset.uploaded", uploaded, "owner").status_code == 202
    eventually(lambda: any(e["type"].endswith("dataset.uploaded.v1") and e["project"] == "default"
                           for e in httpx.get(api, headers=attack.h("owner")).json()["events"]), 30, "the owner's event")
    theirs = httpx.get(api, headers=attack.h("mallory")).json()
    assert theirs["events"] == [] and theirs["jobs"] == [] and theirs["services"] == [] and theirs["triggers"] == []
    owner_jobs = httpx.get(f"{attack.p.gateway}/v1/jobs", headers=attack.h("owner")).json()
    if owner_jobs:
        logs = httpx.get(f"{attack.p.dashboard}/api/jobs/{owner_jobs[0]['id']}/logs", headers=attack.h("mallory"))
        assert logs.status_code == 404


def test_http_limits_hold_on_every_server(attack: Attack) -> None:
    smuggle = httpx.get(f"{attack.p.runtime}/functions/launch-training/x%0d%0aHost:%20evil%0d%0a%0d%0aGET%20/",
                        headers=attack.h("platform"))
    assert smuggle.status_code == 400 and smuggle.json()["field"] == "path"
    deep = b"[" * 100000 + b"]" * 100000
    reply = httpx.post(f"{attack.p.gateway}/v1/jobs", content=deep, headers=attack.h("owner"))
    assert reply.status_code == 400, reply.text
    nested: Any = 1
    for _ in range(300):
        nested = {"a": nested}
    reply = attack.job({"framework": "pytorch", "entrypoint": {"script": "dump.py"}, "hyperparameters": nested})
    assert reply.status_code == 400 and "levels deep" in reply.json()["message"]
    assert httpx.get(f"{attack.p.gateway}/v1/jobs", headers=attack.h("owner")).status_code == 200

    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        while sent < 200 << 20:
            sent += 1 << 16
            yield b" " * (1 << 16)

    for url in (f"{attack.p.gateway}/events", f"{attack.p.runtime}/functions/launch-training"):
        try:
            big = httpx.post(url, content=chunks(), headers={**attack.h("platform"), "content-type": ce_structured()})
            assert big.status_code == 413, (url, big.text)
        except httpx.HTTPError:
            pass  # the server answered 413 and closed while we were still sending
        assert sent < 32 << 20, f"{url} read {sent} bytes before refusing"
        sent = 0


def ce_structured() -> str:
    return "application/cloudevents+json"


def test_slow_headers_are_cut_off_and_metrics_stay_bounded(attack: Attack) -> None:
    host, port = attack.p.gateway.removeprefix("http://").split(":")
    sockets = []
    for _ in range(20):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the rest
        sockets.append(s)
    started = time.monotonic()
    for s in sockets:
        s.settimeout(10)
        assert s.recv(1) == b"", "the server closed the connection"
        s.close()
    assert time.monotonic() - started < 5
    for i in range(300):
        httpx.get(f"{attack.p.gateway}/nowhere-{i}")
    series = [line for line in httpx.get(f"{attack.p.gateway}/metrics").text.splitlines()
              if line.startswith("cascade_gateway_requests_rejected_total")]
    assert len(series) < 20, series


def test_state_and_credentials_are_private_to_the_platform_user(attack: Attack) -> None:
    home = Path(attack.p.env["CASCADE_HOME"])
    assert home.stat().st_mode & 0o777 == 0o700
    for name in ("platform.token", "token", "state.db", "bus.db"):
        assert (home / name).stat().st_mode & 0o077 == 0, name
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    read = subprocess.run([*as_nobody, "cat", str(home / "platform.token")], capture_output=True, text=True)
    assert read.returncode != 0 and "Permission denied" in read.stderr
    probe = ("import sys, urllib.request, urllib.error\n"
             "try:\n    urllib.request.urlopen(sys.argv[1])\nexcept urllib.error.HTTPError as e:\n    print(e.code)\n")
    code = subprocess.run([*as_nobody, "/usr/bin/python3", "-c", probe,
                           f"{attack.p.runtime}/_runtime/services"], capture_output=True, text=True)
    assert code.stdout.strip() == "401", code.stderr
