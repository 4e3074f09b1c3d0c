"""Job records in the state store: the one definition of a job's record, its index and history.

The gateway creates a record when a job is submitted (``create``); the training plane
moves it through ``launching → running → succeeded | failed | cancelled`` (``update``);
the CLI, the dashboard and ``GET /v1/jobs`` read it. Every writer goes through here, so the
indexed fields (``INDEX``) are the same whoever wrote last.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from cascade.stores import StateStore

KIND = "job"
INDEX = ("project", "status", "kind", "backend")
FINAL = ("succeeded", "failed", "cancelled")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def create(store: StateStore, job_id: str, kind: str, project: str, spec: dict[str, Any],
           warnings: list[str] | None = None) -> dict[str, Any]:
    """A new ``submitted`` record (with the resource checklist's warnings, if any)."""
    now = _now()
    record = {"id": job_id, "kind": kind, "project": project, "status": "submitted", "spec": spec,
              "submitted": now, "history": [{"status": "submitted", "time": now}]}
    if warnings:
        record["warnings"] = list(warnings)
    store.put_record(KIND, job_id, record, index=INDEX)
    return record


def get(store: StateStore, job_id: str) -> dict[str, Any] | None:
    return store.get_record(KIND, job_id)


def find(store: StateStore, **where: str) -> list[dict[str, Any]]:
    return store.find_records(KIND, **where)


def forget(store: StateStore, job_id: str) -> None:
    store.delete_record(KIND, job_id)


def update(store: StateStore, job_id: str, status: str, **fields: Any) -> dict[str, Any]:
    """Set ``status`` (and fields) on the job record, creating it if the job came straight from the bus."""
    now = _now()
    record = store.get_record(KIND, job_id) or {"id": job_id, "kind": "training", "history": [], "submitted": now}
    record.update(fields)
    if record.get("status") != status:
        record["status"] = status
        record.setdefault("history", []).append({"status": status, "time": now,
                                                 **({"reason": fields["reason"]} if "reason" in fields else {})})
    store.put_record(KIND, job_id, record, index=INDEX)
    return record
