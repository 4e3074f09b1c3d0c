"""Job records in the state store: the status a job is in and how it got there."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from cascade.stores import StateStore
from cascade.events.gateway.jobs import INDEX

FINAL = ("succeeded", "failed", "cancelled")


def update(store: StateStore, job_id: str, status: str, **fields: Any) -> dict[str, Any]:
    """Set ``status`` (and fields) on the job record, creating it if the job came straight from the bus."""
    now = datetime.now(timezone.utc).isoformat()
    record = store.get_record("job", job_id) or {"id": job_id, "kind": "training", "history": [], "submitted": now}
    record.update(fields)
    if record.get("status") != status:
        record["status"] = status
        record.setdefault("history", []).append({"status": status, "time": now,
                                                 **({"reason": fields["reason"]} if "reason" in fields else {})})
    store.put_record("job", job_id, record, index=INDEX)
    return record
