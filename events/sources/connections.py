"""Which labelling-tool project feeds which dataset of which Cascade project, and what it last completed.

A connection (``cascade sources label-studio connect``, ``... cvat connect``) is a record in
the state store: the tool, its URL, its own project (or task) id, the Cascade project and
dataset it labels, the credential Cascade asks the tool's API with and, for CVAT, the secret
that signs its webhooks. Tools number their projects from 1 in every install, so nothing
here is keyed by the tool's id: the connection id (random) and the Cascade project are in
every event id and every record key.

The record also holds the identity of the last completion published (task count and the
time of the latest annotation change): a completion is published when that identity
changes, so the same completion is never published twice however late it is seen again,
and relabelling (a later change) is a new completion.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput, NotFound
from cascade.events.bus import EventBus
from cascade.events.envelope import new_event
from cascade.events.sources.toolapi import ToolAPI
from cascade.stores import StateStore

KIND = "source-connection"
TOOLS = ("label-studio", "cvat")
SECRET_FIELDS = ("credential", "secret")


@dataclass(frozen=True)
class Completion:
    """A labelling project's finished state as its tool reports it."""

    total: int
    finished: int
    labelled_at: str
    """Time of the latest annotation change the tool reports; part of the completion's identity."""
    annotated: int | None = None

    @property
    def identity(self) -> str:
        return f"{self.total}@{self.labelled_at}"

    @property
    def complete(self) -> bool:
        return 0 < self.total <= self.finished


def public(record: dict[str, Any]) -> dict[str, Any]:
    """A connection as it may be shown: never its credential or signing secret."""
    return {k: v for k, v in record.items() if k not in SECRET_FIELDS}


class Connections:
    def __init__(self, store: StateStore) -> None:
        self.store = store

    def add(self, project: str, tool: str, fields: dict[str, Any]) -> dict[str, Any]:
        if tool not in TOOLS:
            raise InvalidInput(f"tool must be one of {', '.join(TOOLS)}", field="tool")
        conn_id = f"{'ls' if tool == 'label-studio' else 'cvat'}-{secrets.token_hex(5)}"
        record = {"id": conn_id, "project": project, "tool": tool, **fields,
                  "created": datetime.now(timezone.utc).isoformat(), "completed": "", "error": ""}
        self.store.put_record(KIND, conn_id, record, index=("project", "tool"))
        return record

    def save(self, record: dict[str, Any]) -> None:
        self.store.put_record(KIND, str(record["id"]), record, index=("project", "tool"))

    def update(self, record: dict[str, Any], **changes: Any) -> None:
        """Change fields of a connection that still exists (a reconciler never brings back a removed one)."""
        record.update(changes)
        current = self.store.get_record(KIND, str(record["id"]))
        if current is not None:
            self.save({**current, **changes})

    def get(self, conn_id: str, project: str | None = None) -> dict[str, Any]:
        """The connection ``conn_id``; with ``project`` only if it belongs to that project (else 404)."""
        record = self.store.get_record(KIND, conn_id)
        if record is None or (project is not None and record.get("project") != project):
            raise NotFound(f"no source connection {conn_id!r} in this project; list them with: cascade sources ls")
        return record

    def list(self, project: str | None = None, tool: str | None = None) -> list[dict[str, Any]]:
        where = {k: v for k, v in (("project", project), ("tool", tool)) if v}
        return self.store.find_records(KIND, **where)

    def remove(self, conn_id: str) -> bool:
        return self.store.delete_record(KIND, conn_id)


def register_webhook(connections: Connections, api: ToolAPI, record: dict[str, Any], public_url: str,
                     body: Callable[[str], dict[str, Any]], undo: Callable[[], object] = lambda: None) -> dict[str, Any]:
    """Register the tool's webhook (``body(url)``, the URL naming this connection) and save the record; if the
    tool refuses, forget the connection (and ``undo`` what was made for it)."""
    url = f"{public_url.rstrip('/')}/webhooks/{record['tool']}?connection={record['id']}"
    try:
        record["webhook"] = api.add_webhook(body(url))
    except Exception:
        undo()
        connections.remove(str(record["id"]))
        raise
    connections.save(record)
    return record


def completed_event(record: dict[str, Any], done: Completion, *, job: str | None = None) -> CloudEvent:
    """The ``labels.completed`` event for ``done``; its id derives from project, connection and identity."""
    ident = hashlib.sha256(f"{record['project']}\x00{record['id']}\x00{done.identity}".encode()).hexdigest()[:32]
    data: dict[str, Any] = {"project": str(record.get("task") or record["remote"]), "tool": record["tool"],
                            "connection": record["id"], "annotated": done.finished if done.annotated is None
                            else done.annotated, "finished": done.finished, "total": done.total,
                            "labelledAt": done.labelled_at}
    if record.get("dataset"):
        data["dataset"] = record["dataset"]
    if job:
        data["job"] = job
    return new_event("labels.completed", data, source=f"/cascade/sources/{record['tool']}/{record['id']}",
                     id=f"done-{ident}", partitionkey=str(record["id"]), extensions={"project": record["project"]})


def publish_completion(connections: Connections, bus: EventBus, topic: str, record: dict[str, Any],
                       done: Completion | None) -> CloudEvent | None:
    """Publish ``done`` unless it is the completion this connection last published; remember it after."""
    if done is None or not done.complete or record.get("completed") == done.identity:
        return None
    event = completed_event(record, done)
    bus.publish(topic, event)  # durable first: a crash before the record is saved republishes the same id
    connections.update(record, completed=done.identity)
    return event
