"""Several clusters behind one TrainingBackend: each job goes to (and is followed in) the cluster it was placed in.

The inventory's ``clusters`` each have a backend and credentials (``placement.Cluster``); the
matcher chooses cluster and flavor together, and ``PodPlacement.cluster`` says which. This router
holds one backend per cluster (``""`` is the platform's own) and sends a launch by the placement,
and a status, log or cancel by the cluster the job's record names; reconcile and watch cover all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping

from cascade.core.errors import NotFound
from cascade.events import jobrecords as records
from cascade.functions.training.backends.base import Change, TrainingBackend
from cascade.functions.training.job import TrainingJob
from cascade.stores import StateStore


class ClusterRouter:
    name = "clusters"

    def __init__(self, backends: Mapping[str, TrainingBackend], store: StateStore) -> None:
        self.backends, self.store = dict(backends), store

    def _for(self, cluster: str) -> TrainingBackend:
        try:
            return self.backends[cluster]
        except KeyError:
            raise NotFound(f"no cluster {cluster!r} in the inventory (it has: "
                           f"{', '.join(repr(c) for c in self.backends)})") from None

    def _of(self, job_id: str) -> TrainingBackend:
        record = records.get(self.store, job_id) or {}
        return self._for(str(record.get("cluster") or (record.get("placement") or {}).get("cluster") or ""))

    def launch(self, job: TrainingJob, extensions: Mapping[str, str]) -> None:
        self._for(job.placement.cluster).launch(job, extensions)
        records.update(self.store, job.id, str((records.get(self.store, job.id) or {}).get("status", "launching")),
                       cluster=job.placement.cluster)

    def status(self, job_id: str) -> str:
        return self._of(job_id).status(job_id)

    def logs(self, job_id: str) -> str:
        return self._of(job_id).logs(job_id)

    def cancel(self, job_id: str, reason: str = "cancelled on request") -> None:
        self._of(job_id).cancel(job_id, reason)

    def reconcile(self) -> list[Change]:
        return [change for backend in self.backends.values() for change in backend.reconcile()]

    def watch(self, wake: Callable[[], None], stop: threading.Event) -> list[threading.Thread]:
        threads: list[threading.Thread] = []
        for backend in self.backends.values():
            follow = getattr(backend, "watch", None)
            if follow is not None:
                threads += follow(wake, stop)
        return threads
