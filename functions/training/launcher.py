"""The ``launch-training`` function's logic: a submitted job becomes a placed, running job.

On ``job.submitted`` it validates the spec, books a placement in the scheduler's ledger
(image, nodeSelector, tolerations, limits; cards, cores and memory taken from the nodes and
the project's quota) and hands the job to the configured backend. A job that does not fit
now but could later waits in its queue (``job.queued`` with the reason per flavor); one that
could never fit fails at once with the matcher's reason per flavor. Every end of a job
(``job.succeeded``/``failed``/``cancelled``) gives its booking back and launches the waiting
jobs that now fit, each announced by ``job.admitted``. On ``labels.completed`` for a dataset
with a training policy it replies with a ``job.submitted`` for that dataset, so the job takes
the same path as any other.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import replace
from typing import Any, cast

from cloudevents.http import CloudEvent

from cascade.core.errors import CascadeError, InvalidInput, PermanentError, RetryableError
from cascade.core.settings import Settings
from cascade.events import jobrecords as records
from cascade.events.envelope import PROPAGATED, event_type, follow_up
from cascade.functions.training.backends import TrainingBackend, open_backend
from cascade.functions.training.job import TrainingJob
from cascade.functions.training.policy import JobPolicy
from cascade.scheduling.ledger import Admitted, Ledger, Waiting
from cascade.scheduling.placement import Inventory, Job, PodPlacement
from cascade.stores import StateStore, open_store

log = logging.getLogger("cascade.training")
SOURCE = "/cascade/functions/launch-training"
PREEMPTED = "preempted"  # the reason a preempted job's run is cancelled with
ENDS = tuple(event_type(f"job.{end}") for end in ("succeeded", "failed", "cancelled"))
LOCAL_INVENTORY = {"flavors": [{"name": "local-cpu", "vendor": "cpu", "nodeLabels": {},
                                "nodes": [{"name": "localhost", "cards": 0}]}]}


class TrainingLauncher:
    def __init__(self, cfg: Settings) -> None:
        self.cfg = cfg
        self.store = open_store(self.cfg.state_url)
        self.ledger = Ledger(self.store, inventory(cfg))
        self.backend: TrainingBackend = open_backend(self.cfg, self.store)
        self.policy = JobPolicy.from_settings(cfg)
        # The runtime calls handle from several threads at once: each call collects its own follow-ups (job.queued
        # of the runs a booking preempted, job.admitted) to send with its reply.
        self._call = threading.local()

    @property
    def pending(self) -> list[CloudEvent]:
        """This call's follow-ups so far."""
        if not hasattr(self._call, "pending"):
            self._call.pending = []
        return cast(list[CloudEvent], self._call.pending)

    def handle(self, event: CloudEvent) -> CloudEvent | list[CloudEvent] | None:
        if event["type"] == event_type("labels.completed"):
            return self.on_labels(event)
        if event["type"] in ENDS:
            return self.on_ended(event) or None
        self._call.pending = []
        reply = self.on_finetune(event) if event["type"] == event_type("finetune.submitted") else self.on_submitted(event)
        if self.ledger.waiting:  # room may have come without an end (a launch that failed earlier and can go now)
            self.pending.extend(self._admitted(event, self.ledger.admit(self._wanted)))
            self.pending.extend(self._evict(event))
        if not self.pending:
            return reply
        return [*self.pending, *([] if reply is None else [reply] if isinstance(reply, CloudEvent) else reply)]

    def _book(self, event: CloudEvent, job: TrainingJob, request: Job, kind: str,
              payload: dict[str, Any]) -> PodPlacement | CloudEvent:
        """The job's placement, booked; or its job.queued event when it waits for room."""
        booked = self.ledger.book(request, priority=int(job.spec.get("priority", 0)),
                                  payload={"kind": kind, "extensions": extensions(event), **payload})
        self.pending.extend(self._evict(event))
        if isinstance(booked, Waiting):
            reason = "; ".join(f"{k}: {v}" for k, v in booked.reasons.items())
            records.update(self.store, job.id, "queued", reason=reason, project=job.project)
            return follow_up(event, "job.queued", {"jobId": job.id, "queue": request.queue, "reasons": booked.reasons,
                                                   "priority": booked.priority}, source=SOURCE,
                             partitionkey=job.id, subject=job.id)
        return booked.pod()

    def _launch(self, job: TrainingJob, ext: dict[str, str], cause: CloudEvent) -> list[CloudEvent]:
        """Hand a booked job to the backend; a refusal gives the booking back (and fails the job)."""
        try:
            self.backend.launch(job, ext)
        except PermanentError as exc:  # refused (a 4xx, a framework no operator runs); retryable errors redeliver
            records.update(self.store, job.id, "failed", reason=str(exc))
            failed = follow_up(cause, "job.failed", {"jobId": job.id, "reason": str(exc)}, source=SOURCE,
                               partitionkey=job.id, subject=job.id, extensions={**ext, "project": job.project})
            return [failed, *self._admitted(cause, self.ledger.release(job.id, self._wanted))]
        return []

    def _wanted(self, waiting: Waiting) -> bool:
        """A waiting job still wants to run unless it was cancelled (or otherwise ended) while it waited; a
        preempted one whose run is still stopping already says ``queued``, or will."""
        record = records.get(self.store, waiting.job.id) or {}
        return record.get("status") == "queued" or bool(record.get("requeued"))

    def on_ended(self, event: CloudEvent) -> list[CloudEvent]:
        """A job ended: its booking goes back and the waiting jobs that now fit start. A preempted job's
        cancellation is not an end: the ledger already moved it back to its queue."""
        data = event.get_data() or {}
        job_id = str(data.get("jobId", ""))
        if not job_id or str(data.get("reason", "")).startswith(PREEMPTED):
            return []
        admitted = self.ledger.release(job_id, self._wanted)
        return self._evict(event) + self._admitted(event, admitted)

    def _evict(self, cause: CloudEvent) -> list[CloudEvent]:
        """Stop the runs the ledger preempted (their output, with its checkpoints, stays) and say they wait again."""
        out = []
        for job_id in self.ledger.evictions():
            record = records.get(self.store, job_id) or {}
            why = self.ledger.waiting[job_id].reasons.get("preempted", "") if job_id in self.ledger.waiting else ""
            try:
                self.backend.cancel(job_id, f"{PREEMPTED}: {why}")
            except CascadeError as exc:  # it may have just ended; it waits all the same
                log.warning("stopping preempted job %s: %s", job_id, exc)
            records.update(self.store, job_id, "queued", requeued=True, reason=f"{PREEMPTED}: {why}")
            project = str(record.get("project") or "default")
            out.append(follow_up(cause, "job.queued", {"jobId": job_id, "reasons": {"preempted": why}},
                                 source=SOURCE, partitionkey=job_id, subject=job_id, extensions={"project": project}))
        return out

    def _admitted(self, cause: CloudEvent, admitted: list[Admitted]) -> list[CloudEvent]:
        out = []
        for a in admitted:
            w = a.waited
            payload, job_id = w.payload, w.job.id
            spec = payload["spec"]
            if payload["kind"] == "finetune":
                from cascade.functions.finetune import job as finetune

                job = replace(finetune.training_job(job_id, w.job.project, spec),
                              placement=replace(a.placement.pod(), memory_gib=round(w.job.min_memory_gib, 2)))
            else:
                job = TrainingJob(job_id, w.job.project, spec, a.placement.pod())
            ext = {**(payload.get("extensions") or {}), "project": w.job.project}  # the waiting job's, not the cause's
            out.append(follow_up(cause, "job.admitted", {
                "jobId": job_id, "queue": w.job.queue, "waitedSeconds": round(max(0.0, self.ledger.clock() - w.since), 3),
                "placement": job.placement.to_dict()}, source=SOURCE, partitionkey=job_id, subject=job_id, extensions=ext))
            records.update(self.store, job_id, "admitted", project=w.job.project, requeued=False, cancelRequested=False,
                           **({"kind": "finetune", "finetune": spec} if payload["kind"] == "finetune" else {}))
            try:
                out += self._launch(job, ext, cause)
            except RetryableError as exc:  # the backend is down: the job waits again and a later pass retries it
                log.warning("launching admitted job %s: %s", job_id, exc)
                self.ledger.requeue(job_id, str(exc))
                records.update(self.store, job_id, "queued", reason=f"launch failed, will retry: {exc}")
        return out

    def on_finetune(self, event: CloudEvent) -> CloudEvent | list[CloudEvent] | None:
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
            booked = self._book(event, job, request, "finetune", {"spec": data["spec"]})
        except InvalidInput as exc:
            records.update(self.store, job_id, "failed", reason=str(exc), project=project, kind="finetune")
            return follow_up(event, "job.failed", {"jobId": job_id, "reason": str(exc)[:4000]}, source=SOURCE,
                             partitionkey=job_id, subject=job_id)
        if isinstance(booked, CloudEvent):
            return booked
        job = replace(job, placement=replace(booked, memory_gib=round(need.per_card_gib, 2)))
        records.update(self.store, job_id, "submitted", kind="finetune", project=project, finetune=data["spec"])
        return self._launch(job, extensions(event), event) or None

    def on_submitted(self, event: CloudEvent) -> CloudEvent | list[CloudEvent] | None:
        data: dict[str, Any] = event.get_data() or {}
        job_id, project = str(data["jobId"]), str(data.get("project") or event.get("project") or "default")
        record = self.store.get_record("job", job_id)
        if record and record.get("status") not in (None, "submitted"):
            return None  # already launched: a redelivery
        try:
            job = TrainingJob.from_spec(job_id, project, data["spec"])
            self.policy.check("training", job.spec)
            booked = self._book(event, job, job.matcher_job(self.cfg.training.queue), "training", {"spec": job.spec})
        except InvalidInput as exc:
            records.update(self.store, job_id, "failed", reason=str(exc), project=project)
            return follow_up(event, "job.failed", {"jobId": job_id, "reason": str(exc)[:4000]}, source=SOURCE,
                             partitionkey=job_id, subject=job_id)
        if isinstance(booked, CloudEvent):
            return booked
        return self._launch(replace(job, placement=booked), extensions(event), event) or None

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


def inventory(cfg: Settings) -> Inventory:
    """The inventory the settings name, or this machine as one CPU node."""
    path = cfg.training.inventory
    return Inventory.load(path) if path else Inventory.from_dict(LOCAL_INVENTORY)


def extensions(event: CloudEvent) -> dict[str, str]:
    """The attributes a job's own events carry on from the event that started it (project, trace)."""
    return {k: str(event[k]) for k in PROPAGATED if event.get(k)}


def policy_id(project: str, dataset: str) -> str:
    """Policies are per project: two projects' datasets of the same name never share one."""
    return f"{project}/{dataset}"


def set_policy(store: StateStore, dataset: str, spec: dict[str, Any], project: str = "default") -> None:
    """Train ``spec`` whenever ``project``'s labels for ``dataset`` are completed."""
    TrainingJob.from_spec("policy-check", project, {**spec, "dataset": dataset})
    store.put_record("training-policy", policy_id(project, dataset), {"dataset": dataset, "project": project,
                                                                       "spec": spec}, index=("project",))
