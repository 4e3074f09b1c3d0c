"""The ``launch-training`` function's logic: a submitted job becomes a placed, running job.

On ``job.submitted`` it validates the spec, asks the matcher for a placement (image,
nodeSelector, tolerations, limits) and hands the job to the configured backend; a job that
fits nowhere fails at once with the matcher's reason per flavor. On ``labels.completed`` for
a dataset with a training policy it replies with a ``job.submitted`` for that dataset, so
the job takes the same path as any other.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import InvalidInput, PermanentError
from cascade.core.settings import Settings
from cascade.events import jobrecords as records
from cascade.events.envelope import PROPAGATED, event_type, follow_up
from cascade.functions.training.backends import TrainingBackend, open_backend
from cascade.functions.training.job import TrainingJob
from cascade.functions.training.policy import JobPolicy
from cascade.scheduling.matcher import Matcher
from cascade.scheduling.placement import Inventory
from cascade.stores import StateStore, open_store

SOURCE = "/cascade/functions/launch-training"
LOCAL_INVENTORY = {"flavors": [{"name": "local-cpu", "vendor": "cpu", "nodeLabels": {},
                                "nodes": [{"name": "localhost", "cards": 0}]}]}


class TrainingLauncher:
    def __init__(self, cfg: Settings) -> None:
        self.cfg = cfg
        self.store = open_store(self.cfg.state_url)
        path = self.cfg.training.inventory
        self.matcher = Matcher(Inventory.load(path) if path else Inventory.from_dict(LOCAL_INVENTORY))
        self.backend: TrainingBackend = open_backend(self.cfg, self.store)
        self.policy = JobPolicy.from_settings(cfg)

    def handle(self, event: CloudEvent) -> CloudEvent | None:
        if event["type"] == event_type("labels.completed"):
            return self.on_labels(event)
        if event["type"] == event_type("finetune.submitted"):
            return self.on_finetune(event)
        return self.on_submitted(event)

    def on_finetune(self, event: CloudEvent) -> CloudEvent | None:
        """Estimate memory, place on a card that fits it, and run the fine-tune as a training job."""
        from cascade.functions.finetune import job as finetune

        data: dict[str, Any] = event.get_data() or {}
        job_id, project = str(data["jobId"]), str(data.get("project") or event.get("project") or "default")
        record = self.store.get_record("job", job_id)
        if record and record.get("status") not in (None, "submitted"):
            return None
        try:
            need = finetune.memory(data["spec"])
            job = finetune.training_job(job_id, project, data["spec"])
            request = job.matcher_job(self.cfg.training.queue)
            if not request.request.none:
                request = replace(request, min_memory_gib=need.per_card_gib)
            placement = self.matcher.place(request)
        except InvalidInput as exc:
            records.update(self.store, job_id, "failed", reason=str(exc), project=project, kind="finetune")
            return follow_up(event, "job.failed", {"jobId": job_id, "reason": str(exc)[:4000]}, source=SOURCE,
                             partitionkey=job_id, subject=job_id)
        job = replace(job, placement=replace(placement.pod(), memory_gib=round(need.per_card_gib, 2)))
        records.update(self.store, job_id, "submitted", kind="finetune", project=project, finetune=data["spec"])
        self.backend.launch(job, {k: str(event[k]) for k in PROPAGATED if event.get(k)})
        return None

    def on_submitted(self, event: CloudEvent) -> CloudEvent | None:
        data: dict[str, Any] = event.get_data() or {}
        job_id, project = str(data["jobId"]), str(data.get("project") or event.get("project") or "default")
        record = self.store.get_record("job", job_id)
        if record and record.get("status") not in (None, "submitted"):
            return None  # already launched: a redelivery
        try:
            job = TrainingJob.from_spec(job_id, project, data["spec"])
            self.policy.check("training", job.spec)
            placement = self.matcher.place(job.matcher_job(self.cfg.training.queue))
        except InvalidInput as exc:
            records.update(self.store, job_id, "failed", reason=str(exc), project=project)
            return follow_up(event, "job.failed", {"jobId": job_id, "reason": str(exc)[:4000]}, source=SOURCE,
                             partitionkey=job_id, subject=job_id)
        job = replace(job, placement=placement.pod())
        extensions = {k: str(event[k]) for k in PROPAGATED if event.get(k)}
        try:
            self.backend.launch(job, extensions)
        except PermanentError as exc:  # refused (a 4xx, a framework no operator runs); retryable errors redeliver
            records.update(self.store, job_id, "failed", reason=str(exc))
            return follow_up(event, "job.failed", {"jobId": job_id, "reason": str(exc)}, source=SOURCE,
                             partitionkey=job_id, subject=job_id)
        return None

    def on_labels(self, event: CloudEvent) -> CloudEvent | None:
        dataset = (event.get_data() or {}).get("dataset")
        project = str(event.get("project") or "default")
        policy = self.store.get_record("training-policy", policy_id(project, str(dataset))) if dataset else None
        if policy is None:
            return None
        job_id = "job-" + hashlib.sha256(f"{project}\x00{event['source']}\x00{event['id']}".encode()).hexdigest()[:16]
        spec = {**policy["spec"], "dataset": dataset}
        records.update(self.store, job_id, "submitted", spec=spec, project=project, trigger=str(event["id"]))
        return follow_up(event, "job.submitted", {"jobId": job_id, "project": project, "spec": spec}, source=SOURCE,
                         partitionkey=job_id, subject=job_id, id=f"submit-{job_id}")


def policy_id(project: str, dataset: str) -> str:
    """Policies are per project: two projects' datasets of the same name never share one."""
    return f"{project}/{dataset}"


def set_policy(store: StateStore, dataset: str, spec: dict[str, Any], project: str = "default") -> None:
    """Train ``spec`` whenever ``project``'s labels for ``dataset`` are completed."""
    TrainingJob.from_spec("policy-check", project, {**spec, "dataset": dataset})
    store.put_record("training-policy", policy_id(project, dataset), {"dataset": dataset, "project": project,
                                                                       "spec": spec}, index=("project",))
