"""Keep job records and the bus in step with where jobs really run.

A backend's ``reconcile`` finds jobs whose real state moved past their record (a Kubernetes
job that finished, a local supervisor that was killed); this loop publishes the matching
lifecycle events, at start-up (restore after a restart) and then every ``interval`` seconds.
Lifecycle event ids are deterministic per job and status, so two watchers publishing the
same change are deduplicated downstream.
"""

from __future__ import annotations

import logging
import threading

from cascade.core.errors import CascadeError
from cascade.events.bus import EventBus
from cascade.functions.training.backends import TrainingBackend, lifecycle_event

SOURCE = "/cascade/functions/job-watch"
log = logging.getLogger("cascade.training")


class JobWatcher:
    def __init__(self, backend: TrainingBackend, bus: EventBus, topic: str, *, interval: float = 10.0) -> None:
        self.backend, self.bus, self.topic, self.interval = backend, bus, topic, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> int:
        """One pass; the number of lifecycle events published."""
        changes = self.backend.reconcile()
        for change in changes:
            self.bus.publish(self.topic, lifecycle_event(change, SOURCE))
        return len(changes)

    def _run(self) -> None:
        while True:
            try:
                self.once()
            except CascadeError as exc:  # a store or bus outage: the next pass tries again
                log.warning("job watch: %s", exc)
            if self._stop.wait(self.interval):
                return

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="job-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
