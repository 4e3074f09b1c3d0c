"""CVAT as a connected source: its API, a per-connection signed webhook, and its completion.

A connection names a CVAT project or a task (``--project-id`` / ``--task-id``). Labels are
complete when every annotation job of it is in state ``completed`` (ground-truth jobs are
not labelling work); the completion's identity is the job count and the latest
``updated_date`` among the jobs, so reopening and completing a job again is a new
completion and the same state seen twice is not.

CVAT signs each webhook body with the connection's own secret (``X-Signature-256``), which
``connect`` generates and gives to CVAT; the signature, not a query parameter, decides which
Cascade project a delivery belongs to. CVAT sends webhooks per project, so a task's
connection registers its webhook on the task's project.
"""

from __future__ import annotations

import secrets
from typing import Any

import httpx

from cascade.core.errors import InvalidInput, SourceUnavailable
from cascade.events.sources.connections import Completion, Connections, register_webhook
from cascade.events.sources.label_studio import dataset_name, positive_id
from cascade.events.sources.toolapi import ToolAPI, check_url

WEBHOOK_EVENTS = ["update:job", "create:job", "delete:job", "update:task", "delete:task"]


class CVATAPI(ToolAPI):
    name, credential = "CVAT", "/password"

    def __init__(self, url: str, username: str, password: str, *, timeout: float = 10.0) -> None:
        super().__init__(url, {"Accept": "application/json"}, timeout=timeout, auth=httpx.BasicAuth(username, password))

    def owner_project(self, remote: int, task: int | None) -> tuple[int, str]:
        """The CVAT project the webhook goes on, and the labelled thing's name (checks both exist)."""
        if task is None:
            return remote, str(self.object("GET", f"/api/projects/{remote}", f"project {remote}").get("name") or "")
        found = self.object("GET", f"/api/tasks/{task}", f"task {task}")
        if not isinstance(found.get("project_id"), int):
            raise InvalidInput(f"CVAT task {task} is in no project, and CVAT sends webhooks per project: "
                               "move it into a project, or connect the project", field="/taskId")
        return int(found["project_id"]), str(found.get("name") or "")

    def jobs(self, remote: int, task: int | None) -> list[dict[str, Any]]:
        path: str | None = f"/api/jobs?{'task_id=' + str(task) if task else 'project_id=' + str(remote)}&page_size=100"
        found: list[dict[str, Any]] = []
        while path:
            page = self.object("GET", path, "the jobs")
            if not isinstance(page.get("results"), list):
                raise SourceUnavailable("CVAT answered the job list without 'results'")
            found += [j for j in page["results"] if isinstance(j, dict)]
            nxt = page.get("next")
            path = nxt.removeprefix(self.url) if isinstance(nxt, str) and nxt.startswith(self.url) and len(found) < 100_000 else None
        return found

    def completion(self, remote: int, task: int | None) -> Completion:
        jobs = [j for j in self.jobs(remote, task) if j.get("type", "annotation") == "annotation"]
        finished = sum(1 for j in jobs if j.get("state") == "completed")
        latest = max((str(j.get("updated_date") or "") for j in jobs), default="")
        return Completion(len(jobs), finished, latest if jobs and finished == len(jobs) else "")


def api_of(record: dict[str, Any]) -> CVATAPI:
    username, _, password = str(record["credential"]).partition(":")
    return CVATAPI(str(record["url"]), username, password)


def connect(connections: Connections, project: str, body: Any, public_url: str) -> dict[str, Any]:
    """Record the connection with a fresh signing secret and register CVAT's webhook; returns the record."""
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object with url, username, password, projectId or taskId, "
                           "and dataset", field="/")
    url = check_url(str(body.get("url") or ""))
    username, password = body.get("username"), body.get("password")
    if not isinstance(username, str) or not username or ":" in username:
        raise InvalidInput("username is required (a CVAT user that can see the project)", field="/username")
    if not isinstance(password, str) or not password:
        raise InvalidInput("password is required", field="/password")
    if (body.get("projectId") is None) == (body.get("taskId") is None):
        raise InvalidInput("name exactly one of projectId and taskId", field="/projectId")
    task = positive_id(body["taskId"], "/taskId") if body.get("taskId") is not None else None
    remote = positive_id(body["projectId"], "/projectId") if task is None else 0
    dataset = dataset_name(body.get("dataset"))
    api = CVATAPI(url, username, password)
    try:
        owner, title = api.owner_project(remote, task)
        secret = secrets.token_urlsafe(32)
        record = connections.add(project, "cvat", {"url": url, "remote": owner, "task": task, "dataset": dataset,
                                                   "title": title[:200], "credential": f"{username}:{password}",
                                                   "secret": secret})
        return register_webhook(connections, api, record, public_url, lambda url: {
            "target_url": url, "description": "Cascade", "type": "project", "project_id": owner,
            "content_type": "application/json", "secret": secret, "is_active": True, "enable_ssl": True,
            "events": WEBHOOK_EVENTS})
    finally:
        api.close()
