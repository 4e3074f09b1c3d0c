"""Label Studio as a connected source: its API, the webhook it is given, and its completion.

Label Studio posts each webhook once (1 s timeout) and never retries, so a webhook is only a
hint here: completion is read from the project itself (``GET /api/projects/<id>``:
``finished_task_number`` of ``task_number``, which honours overlap and skipped tasks) and
the time of its latest change (the most recently updated task; an annotation's save or
deletion updates its task). The reconciler asks on every hint, on start and periodically,
so a completion that happened while the gateway was down is still published, once.

``connect`` checks the key and the project, creates a publish-only token for the webhook,
and registers the webhook in Label Studio with that token in its ``Authorization`` header.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

from cascade.core.errors import InvalidInput, SourceUnavailable
from cascade.events.identity import Projects
from cascade.events.sources.connections import Completion, Connections, register_webhook
from cascade.events.sources.toolapi import ToolAPI, check_url

_DATASET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class LabelStudioAPI(ToolAPI):
    name, credential, webhooks = "Label Studio", "/apiKey", "/api/webhooks/"

    def __init__(self, url: str, api_key: str, *, timeout: float = 10.0) -> None:
        super().__init__(url, {"Authorization": f"Token {api_key}"}, timeout=timeout)

    def latest_change(self, project_id: int) -> str:
        """``updated_at`` of the project's most recently updated task ("" when it has none)."""
        query = quote(json.dumps({"ordering": ["-tasks:updated_at"]}))
        page = self.object("GET", f"/api/tasks/?project={project_id}&page_size=1&query={query}",
                           f"the tasks of project {project_id}")
        tasks = page.get("tasks")
        if not isinstance(tasks, list):
            raise SourceUnavailable("Label Studio answered the task list without a 'tasks' list")
        return str(tasks[0].get("updated_at") or "") if tasks and isinstance(tasks[0], dict) else ""

    def completion(self, project_id: int) -> Completion:
        info = self.object("GET", f"/api/projects/{project_id}", f"project {project_id}")
        total, finished, annotated = (info.get(k) for k in ("task_number", "finished_task_number",
                                                           "num_tasks_with_annotations"))
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (total, finished)):
            raise SourceUnavailable("Label Studio answered the project without task_number and finished_task_number")
        assert isinstance(total, int) and isinstance(finished, int)
        changed = self.latest_change(project_id) if 0 < total <= finished else ""
        return Completion(total, finished, changed, annotated if isinstance(annotated, int) else None)


def dataset_name(value: Any) -> str:
    if not isinstance(value, str) or not _DATASET.match(value):
        raise InvalidInput("dataset must be a name of letters, digits, '.', '_' and '-' (at most 128)", field="/dataset")
    return value


def positive_id(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidInput(f"{field.strip('/')} must be a positive integer (the tool's own id)", field=field)
    return value


def connect(connections: Connections, project: str, body: Any, public_url: str) -> dict[str, Any]:
    """Record the connection, give it a webhook token and register the webhook; returns the record."""
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object with url, apiKey, projectId and dataset", field="/")
    url = check_url(str(body.get("url") or ""))
    api_key = body.get("apiKey")
    if not isinstance(api_key, str) or not api_key.strip():
        raise InvalidInput("apiKey is required: Label Studio's access token (Account & Settings)", field="/apiKey")
    remote, dataset = positive_id(body.get("projectId"), "/projectId"), dataset_name(body.get("dataset"))
    api = LabelStudioAPI(url, api_key)
    try:
        info = api.object("GET", f"/api/projects/{remote}", f"project {remote}")
        record = connections.add(project, "label-studio", {"url": url, "remote": remote, "dataset": dataset,
                                                           "title": str(info.get("title") or "")[:200],
                                                           "credential": api_key})
        projects = Projects(connections.store)
        token = projects.create_token(project, f"label-studio webhook of {record['id']}", ["publish"])
        identity = projects.lookup(token)
        record["token"] = identity.token_id if identity else ""
        return register_webhook(connections, api, record, public_url, lambda url: {
            "project": remote, "url": url, "send_payload": True, "send_for_all_actions": True, "is_active": True,
            "headers": {"Authorization": f"Bearer {token}"}}, undo=lambda: projects.revoke(record["token"]))
    finally:
        api.close()
