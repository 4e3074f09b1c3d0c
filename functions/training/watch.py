"""Keep job records and the bus in step with where jobs really run.

A backend's ``reconcile`` finds jobs whose real state moved past their record (a Kubernetes
job that finished, a local supervisor that was killed); this loop publishes the matching
lifecycle events, at start-up (restore after a restart), whenever a backend that can watch
(Kubernetes) sees its resources change, and at the latest every ``interval`` seconds. A
change's record is committed only after its event is on the bus; lifecycle event ids are
deterministic per job and status, so a change published twice (two watchers, or a crash
between publish and commit) is deduplicated downstream.
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
        self._stop, self._wake = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def once(self) -> int:
        """One pass; the number of lifecycle events published."""
        changes = self.backend.reconcile()
        for change in changes:
            self.bus.publish(self.topic, lifecycle_event(change, SOURCE))
            if change.commit is not None:
                change.commit()
        return len(changes)

    def wake(self) -> None:
        """Run a pass now (a watched resource changed)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.once()
            except CascadeError as exc:  # a store, bus or API server outage: the next pass tries again
                log.warning("job watch: %s", exc)
            self._wake.wait(self.interval)

    def start(self) -> None:
        watch = getattr(self.backend, "watch", None)
        if watch is not None:
            watch(self.wake, self._stop)
        self._thread = threading.Thread(target=self._run, name="job-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
