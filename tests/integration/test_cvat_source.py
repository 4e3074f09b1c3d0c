"""CVAT connections: a per-connection signing secret, completion from CVAT's own job states.

CVAT needs Docker, PostgreSQL, Redis and OPA to run, none of which this machine has, so its
REST API is played by a small server with CVAT's documented shapes (``/api/projects``,
``/api/tasks``, paginated ``/api/jobs``, ``/api/webhooks``, Basic auth). The gateway, the
reconciler, the bus and the store are the real ones.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response

from cascade.core.asgi import ServerThread
from cascade.core.ports import free_port
from cascade.core.settings import GatewaySettings
from cascade.events.bus.embedded import EmbeddedBus
from cascade.events.gateway import create_app
from cascade.events.identity import Projects
from cascade.events.sources.labelling import Reconciler
from cascade.stores.sqlite import SqliteStore
from tests.helpers.waiting import eventually, holds

TOPIC = "cascade.events"


@dataclass
class FakeCVAT:
    """CVAT's REST API as the connection uses it; jobs and webhooks are inspectable."""

    jobs: list[dict[str, Any]] = field(default_factory=list)
    hooks: dict[int, dict[str, Any]] = field(default_factory=dict)

    def app(self) -> FastAPI:
        api = FastAPI()

        def auth(request: Request) -> None:
            if request.headers.get("authorization") != "Basic " + base64.b64encode(b"ann:pw").decode():
                raise HTTPException(401)

        @api.get("/api/projects/{pid}")
        def project(pid: int, request: Request) -> dict[str, Any]:
            auth(request)
            if pid != 2:
                raise HTTPException(404)
            return {"id": 2, "name": "cats"}

        @api.get("/api/tasks/{tid}")
        def task(tid: int, request: Request) -> dict[str, Any]:
            auth(request)
            return {"id": tid, "name": "lonely", "project_id": None} if tid == 9 else {"id": tid, "name": "t", "project_id": 2}

        @api.get("/api/jobs")
        def jobs(request: Request, page: int = 1, project_id: int | None = None, task_id: int | None = None) -> dict[str, Any]:
            auth(request)
            mine = [j for j in self.jobs if (task_id is None or j["task_id"] == task_id)]
            chunk = mine[(page - 1) * 2: page * 2]  # two per page: the client must follow ``next``
            more = len(mine) > page * 2
            base = str(request.base_url).rstrip("/")
            nxt = f"{base}/api/jobs?page={page + 1}&project_id={project_id}" if more else None
            return {"count": len(mine), "next": nxt, "results": chunk}

        @api.post("/api/webhooks", status_code=201)
        async def add_hook(request: Request) -> dict[str, Any]:
            auth(request)
            hook_id = len(self.hooks) + 1
            self.hooks[hook_id] = await request.json()
            return {"id": hook_id}

        @api.delete("/api/webhooks/{hook_id}")
        def delete_hook(hook_id: int, request: Request) -> Response:
            auth(request)
            self.hooks.pop(hook_id)
            return Response(status_code=204)

        return api


@dataclass
class Env:
    gateway: str
    cvat: FakeCVAT
    cvat_url: str
    bus: EmbeddedBus
    token: str
    other: str

    def completions(self) -> list[Any]:
        consumer = self.bus.subscribe([TOPIC], f"check-{uuid.uuid4().hex}", start="earliest")
        seen = []
        while batch := consumer.poll(0.2):
            seen += [r.event() for r in batch if r.event()["type"] == "io.cascade.labels.completed.v1"]
        consumer.close()
        return seen

    def deliver(self, conn: str, body: dict[str, Any], secret: str) -> httpx.Response:
        raw = json.dumps(body).encode()
        signature = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
        return httpx.post(f"{self.gateway}/webhooks/cvat?connection={conn}&project=default", content=raw,
                          headers={"x-signature-256": signature, "content-type": "application/json"})


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    bus, store = EmbeddedBus(tmp_path / "bus.db"), SqliteStore(tmp_path / "state.db")
    projects = Projects(store)
    for name in ("alpha", "beta"):
        projects.create_project(name)
    cvat = FakeCVAT([{"id": n, "task_id": 7, "project_id": 2, "type": "annotation", "state": "in progress",
                      "updated_date": f"2026-11-30T10:00:0{n}Z"} for n in range(1, 4)]
                    + [{"id": 4, "task_id": 7, "project_id": 2, "type": "ground_truth", "state": "new",
                        "updated_date": "2026-11-30T09:00:00Z"}])
    tool = ServerThread(cvat.app(), port=free_port()).start()
    reconciler = Reconciler(store, bus, TOPIC, interval=3600, settle=0.2)
    port = free_port()
    app = create_app(bus, store, GatewaySettings(port=port), TOPIC, poke=reconciler.poke)
    gateway = ServerThread(app, port=port).start()
    reconciler.start()
    try:
        yield Env(gateway.url, cvat, tool.url, bus, projects.create_token("alpha"), projects.create_token("beta"))
    finally:
        reconciler.stop()
        gateway.stop()
        tool.stop()
        bus.close()


def connect(env: Env, token: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{env.gateway}/v1/sources/cvat", headers={"authorization": f"Bearer {token}"},
                      json={"url": env.cvat_url, "username": "ann", "password": "pw", "dataset": "cats", **body})


def test_a_cvat_connection_completes_from_job_states_signed_by_its_own_secret(env: Env) -> None:
    reply = connect(env, env.token, projectId=2)
    assert reply.status_code == 201, reply.text
    conn = reply.json()
    assert "secret" not in conn and "credential" not in conn and "pw" not in reply.text
    [hook] = env.cvat.hooks.values()
    assert hook["target_url"].endswith(f"/webhooks/cvat?connection={conn['id']}") and "update:job" in hook["events"]
    secret = hook["secret"]
    update = {"event": "update:job", "job": {"id": 1, "state": "completed"}, "before_update": {"state": "in progress"}}
    assert env.deliver(conn["id"], update, "not-the-secret").status_code == 401
    for job in env.cvat.jobs[:3]:
        job["state"] = "completed"
        assert env.deliver(conn["id"], update, secret).status_code == 202
    eventually(lambda: len(env.completions()) == 1, 15, "every annotation job completed")
    [done] = env.completions()
    assert done["project"] == "alpha", "the connection decides the project, not ?project="
    assert done.get_data() == {"project": "2", "tool": "cvat", "connection": conn["id"], "annotated": 3, "finished": 3,
                               "total": 3, "labelledAt": "2026-11-30T10:00:03Z", "dataset": "cats"}
    assert env.deliver(conn["id"], update, secret).status_code == 202
    holds(lambda: len(env.completions()) == 1, 1.0, "the same state is not a second completion")
    env.cvat.jobs[0].update(state="completed", updated_date="2026-11-30T11:00:00Z")  # reopened and completed again
    assert env.deliver(conn["id"], update, secret).status_code == 202
    eventually(lambda: len(env.completions()) == 2, 15, "a later completion is a new one")


def test_cvat_connections_are_checked_and_belong_to_one_project(env: Env) -> None:
    assert connect(env, env.token, projectId=5).status_code == 404
    assert connect(env, env.token, projectId=2, password="wrong").json()["field"] == "/password"
    assert connect(env, env.token, taskId=9).json()["field"] == "/taskId", "a task in no project gets no webhook"
    assert connect(env, env.token, projectId=2, taskId=7).json()["field"] == "/projectId"
    assert connect(env, env.token, projectId=2, url="file:///etc/passwd").json()["field"] == "/url"
    down = httpx.post(f"{env.gateway}/v1/sources/cvat", headers={"authorization": f"Bearer {env.token}"},
                      json={"url": f"http://127.0.0.1:{free_port()}", "username": "ann", "password": "pw",
                            "projectId": 2, "dataset": "cats"})
    assert down.status_code == 503 and "did not answer" in down.json()["message"]
    conn = connect(env, env.token, taskId=7).json()
    assert conn["remote"] == 2 and conn["task"] == 7, "a task's webhook goes on its project"
    listed = httpx.get(f"{env.gateway}/v1/sources", headers={"authorization": f"Bearer {env.other}"}).json()
    assert listed == [], "another project does not see the connection"
    gone = httpx.delete(f"{env.gateway}/v1/sources/{conn['id']}", headers={"authorization": f"Bearer {env.other}"})
    assert gone.status_code == 404
    mine = httpx.delete(f"{env.gateway}/v1/sources/{conn['id']}", headers={"authorization": f"Bearer {env.token}"})
    assert mine.json() == {"id": conn["id"], "removed": True, "note": "webhook removed"} and env.cvat.hooks == {}
    unknown = env.deliver(conn["id"], {"event": "update:job"}, "whatever")
    assert unknown.status_code == 404
