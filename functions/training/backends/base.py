"""The TrainingBackend protocol: where a placed training job runs, and how its end is learned.

Two implementations ship and pass ``tests/contract/test_training_backend_contract.py``:
``local`` (a supervisor process per job on this machine) and ``kubernetes`` (the operator's
resource, applied server-side). A backend keeps the job record current (``records.update``);
``reconcile`` compares the record with what really runs and returns the changes, which the
caller publishes as lifecycle events (``lifecycle_event``), so a job whose supervisor or
resource vanished, or that ended while nobody watched, still ends on the bus.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cloudevents.http import CloudEvent

from cascade.events.envelope import new_event
from cascade.functions.training.job import TrainingJob

PHASES = ("launching", "running", "succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Change:
    """A job whose real state moved past its record; ``data`` goes into the lifecycle event. ``commit``, where
    given, records the new state and is called only once the event is on the bus (so a bus outage between
    the two loses nothing: the next pass finds the same change again)."""

    job_id: str
    status: str
    data: Mapping[str, Any]
    extensions: Mapping[str, str]
    commit: Callable[[], None] | None = None


class TrainingBackend(Protocol):
    name: str

    def launch(self, job: TrainingJob, extensions: Mapping[str, str]) -> None:
        """Start the placed job and record it as ``launching``; raise RetryableError if the target is down."""
        ...

    def status(self, job_id: str) -> str:
        """One of PHASES, read from where the job runs; NotFound for a job this backend never launched."""
        ...

    def logs(self, job_id: str) -> str:
        """The workers' output so far; NotFound when there is none yet."""
        ...

    def cancel(self, job_id: str, reason: str = "cancelled on request") -> None:
        """Stop the job; it ends as ``cancelled`` with ``reason`` (``pruned`` by an experiment). Cancelling a finished
        job does nothing."""
        ...

    def reconcile(self) -> list[Change]:
        """After a restart (or periodically): every unfinished job of this backend whose real state
        differs from its record, with the record already updated or a ``commit`` that updates it."""
        ...


def lifecycle_event(change: Change, source: str) -> CloudEvent:
    """The ``job.<status>`` event for a change (``job.started`` for running)."""
    family = "job.started" if change.status == "running" else f"job.{change.status}"
    return new_event(family, {"jobId": change.job_id, **change.data}, source=source, partitionkey=change.job_id,
                     subject=change.job_id, extensions=dict(change.extensions),
                     id=f"{family}-{change.job_id}")
