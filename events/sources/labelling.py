"""Connected labelling tools, one interface for both: connect, disconnect, and the reconciler.

The reconciler asks every connected tool for its completion on start, every ``interval``
seconds, and at once (and again ``settle`` seconds later) when a webhook pokes it; a
completion is published when it differs from the one the connection last published and has
held for ``settle`` seconds (a reviewer correcting five labels in a row is one new
completion, not five trainings). So a webhook that was never sent (Label Studio does not
retry), or sent while the gateway was down, still yields exactly one ``labels.completed``.
A tool that does not answer is noted on its connection (``cascade sources ls`` shows it) and
asked again next round.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cloudevents.http import CloudEvent

from cascade.core.errors import CascadeError
from cascade.events.bus import EventBus
from cascade.events.identity import Projects
from cascade.events.sources import cvat, label_studio
from cascade.events.sources.connections import KIND, Completion, Connections, publish_completion
from cascade.events.sources.toolapi import ToolAPI
from cascade.stores import StateStore

log = logging.getLogger("cascade.sources.labelling")


def connect(connections: Connections, tool: str, project: str, body: Any, public_url: str) -> dict[str, Any]:
    """Connect a tool's project to a dataset of ``project`` (see each tool's module)."""
    if tool == "label-studio":
        return label_studio.connect(connections, project, body, public_url)
    return cvat.connect(connections, project, body, public_url)


def api_of(record: dict[str, Any]) -> ToolAPI:
    """A client of the connection's tool, with the connection's credential."""
    if record["tool"] == "label-studio":
        return label_studio.LabelStudioAPI(str(record["url"]), str(record["credential"]))
    return cvat.api_of(record)


def completion_of(record: dict[str, Any]) -> Completion:
    """Ask the connection's tool how far its labelling is."""
    api = api_of(record)
    try:
        if isinstance(api, label_studio.LabelStudioAPI):
            return api.completion(int(record["remote"]))
        assert isinstance(api, cvat.CVATAPI)
        return api.completion(int(record["remote"]), record.get("task"))
    finally:
        api.close()


def disconnect(connections: Connections, record: dict[str, Any]) -> dict[str, Any]:
    """Remove the tool's webhook (when the tool answers), revoke the webhook's token, forget the connection."""
    note = "webhook removed"
    try:
        api = api_of(record)
        try:
            api.delete_webhook(int(record["webhook"]))
        finally:
            api.close()
    except (CascadeError, KeyError, TypeError, ValueError) as exc:
        note = f"webhook left in the tool ({exc}); its token is revoked, so its deliveries are refused"
    if record.get("token"):
        try:
            Projects(connections.store).revoke(str(record["token"]))
        except CascadeError:
            pass  # already revoked by hand
    connections.remove(str(record["id"]))
    return {"id": record["id"], "removed": True, "note": note}


class Reconciler:
    def __init__(self, store: StateStore, bus: EventBus, topic: str, *, interval: float = 60.0,
                 settle: float = 2.0) -> None:
        self.connections, self.bus, self.topic = Connections(store), bus, topic
        self.interval, self.settle = interval, settle
        self._due: dict[str, list[float]] = {}
        self._pending: dict[str, tuple[str, float]] = {}  # connection -> (new completion, when first seen)
        self._lock = threading.Lock()
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def poke(self, conn_id: str) -> None:
        """A webhook arrived for ``conn_id``: ask its tool now, and once more after ``settle``."""
        now = time.monotonic()
        self._schedule(conn_id, now, now + self.settle)

    def _schedule(self, conn_id: str, *times: float) -> None:
        with self._lock:
            self._due[conn_id] = sorted({*self._due.get(conn_id, []), *times})
        self._wake.set()

    def check(self, record: dict[str, Any]) -> CloudEvent | None:
        """Ask one connection's tool; publish its completion if it is new."""
        try:
            done = completion_of(record)
        except CascadeError as exc:
            if record.get("error") != str(exc):
                log.warning("source %s (%s at %s): %s", record["id"], record["tool"], record["url"], exc)
                self.connections.update(record, error=str(exc))
            return None
        if record.get("error"):
            self.connections.update(record, error="")
        conn_id, now = str(record["id"]), time.monotonic()
        if not done.complete or record.get("completed") == done.identity:
            self._pending.pop(conn_id, None)
            return None
        seen, since = self._pending.get(conn_id, ("", now))
        if seen != done.identity:
            self._pending[conn_id] = (done.identity, now)
            since = now
        if now - since < self.settle:
            self._schedule(conn_id, since + self.settle)  # publish once it has held still
            return None
        self._pending.pop(conn_id, None)
        return publish_completion(self.connections, self.bus, self.topic, record, done)

    def check_all(self) -> list[CloudEvent]:
        return [e for r in self.connections.list() if (e := self._check_logged(r)) is not None]

    def _check_logged(self, record: dict[str, Any]) -> CloudEvent | None:
        try:
            return self.check(record)
        except Exception:  # the bus or the store away: the next round asks again
            log.exception("reconciling source %s failed; retrying next round", record.get("id"))
            return None

    def _take_due(self, now: float) -> tuple[list[str], float]:
        """Connection ids due now, and the next time one falls due."""
        due, soonest = [], float("inf")
        with self._lock:
            for conn_id, times in list(self._due.items()):
                if times and times[0] <= now:
                    due.append(conn_id)
                    times.pop(0)
                if not times:
                    del self._due[conn_id]
                else:
                    soonest = min(soonest, times[0])
        return due, soonest

    def run(self) -> None:
        next_round = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_round:
                self.check_all()
                next_round = now + self.interval
            due, soonest = self._take_due(now)
            for conn_id in due:
                record = self.connections.store.get_record(KIND, conn_id)
                if record is not None:
                    self._check_logged(record)
            self._wake.wait(max(0.0, min(next_round, soonest) - time.monotonic()))
            self._wake.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="labelling-reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
