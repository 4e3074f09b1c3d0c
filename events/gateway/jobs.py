"""Job submissions: validate a spec, keep the job record, make the ``*.submitted`` event.

The record is written before the event is published (and removed if publishing fails), so
``GET /v1/jobs/{id}`` can answer as soon as the client has a job id. An ``Idempotency-Key``
header makes the job id deterministic: a retried submission returns the same job.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput, NotFound
from cascade.events import jobrecords, schemas
from cascade.events.envelope import new_event
from cascade.events.gateway.errors import Forbidden
from cascade.stores import StateStore

KINDS = {"training": ("trainingjob.v1", "job.submitted"), "finetune": ("finetunejob.v1", "finetune.submitted")}


class Jobs:
    def __init__(self, store: StateStore) -> None:
        self.store = store

    def prepare(self, project: str, body: Any, idempotency_key: str | None,
                check: Callable[[str, dict[str, Any], str], list[str]] | None = None,
                ) -> tuple[dict[str, Any], CloudEvent, bool]:
        """(job record, submitted event, whether it is new) for a submission body.

        ``check(kind, spec, project)`` is the training backend's job policy (entrypoints, caps; it raises) and the
        resource checklist (it returns warnings, kept on the record)."""
        if not isinstance(body, dict):
            raise InvalidInput("the body must be a JSON object with 'kind' and 'spec'", field="/")
        kind = body.get("kind", "training")
        if kind not in KINDS:
            raise InvalidInput(f"kind must be one of {sorted(KINDS)}", field="/kind")
        spec_schema, family = KINDS[kind]
        spec = body.get("spec")
        schemas.validate(spec_schema, spec, prefix="/spec")
        assert isinstance(spec, dict)
        if spec.get("project", project) != project:
            raise Forbidden(f"this token submits into project {project!r}", field="/spec/project")
        warnings = check(kind, spec, project) if check is not None else []
        if idempotency_key:
            job_id = "job-" + hashlib.sha256(f"{project}\x00{idempotency_key}".encode()).hexdigest()[:16]
        else:
            job_id = "job-" + uuid.uuid4().hex[:16]
        existing = jobrecords.get(self.store, job_id)
        event = new_event(family, {"jobId": job_id, "project": project, "spec": spec}, source="/cascade/api/jobs",
                          id=f"submit-{job_id}", subject=job_id, partitionkey=job_id, extensions={"project": project})
        if existing:
            return existing, event, False
        return jobrecords.create(self.store, job_id, kind, project, spec, warnings=warnings), event, True

    def forget(self, job_id: str) -> None:
        jobrecords.forget(self.store, job_id)

    def get(self, project: str | None, job_id: str) -> dict[str, Any]:
        """The job ``job_id`` of ``project`` (of any project for None: the platform)."""
        job = jobrecords.get(self.store, job_id)
        if job is None or (project is not None and job.get("project") != project):
            raise NotFound(f"no job {job_id!r} in project {project!r}")
        return job

    def list(self, project: str, status: str | None = None) -> list[dict[str, Any]]:
        where = {"project": project} if status is None else {"project": project, "status": status}
        return jobrecords.find(self.store, **where)
