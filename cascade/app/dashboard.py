"""The live dashboard: one page that shows the platform as it works.

It reads only what every other tool reads, so it runs beside any deployment: the bus (its own
consumer group from ``latest``, keeping the newest events and the edge clusters' heartbeats),
the state store (trigger counters the dispatcher saves, jobs, the model registry) and the
runtime's admin API (instances per service, live model routes). Trigger lag needs a round
trip per topic on Kafka, so a background thread refreshes it; the page polls ``/api/snapshot``
and draws the rest (``dashboard.html``), including each service's instance history.

The page itself holds no data; ``/api/*`` answers a bearer token with the ``read`` scope and
shows that token's project only (its events, jobs and models); the platform-wide parts
(triggers, function instances, edge clusters) need the platform credential. The page builds
every row with ``textContent``, never HTML from data.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse

from cascade.core.errors import CascadeError, InvalidInput, NotFound
from cascade.core.versions import version_key
from cascade.events import experiments
from cascade.events.bus import EventBus, Record
from cascade.events.dispatcher.service import trigger_lag
from cascade.events.envelope import event_type
from cascade.events.gateway.errors import problem
from cascade.events.health import Health
from cascade.events.identity import Authenticator, Identity
from cascade.events.triggers import Trigger
from cascade.serving.registry import Registry
from cascade.serving.runtime.admin import runtime_admin
from cascade.stores import StateStore

PAGE = Path(__file__).with_name("dashboard.html")
HEARTBEAT = event_type("edge.heartbeat")


class Dashboard:
    def __init__(self, bus: EventBus, state: StateStore, topic: str, triggers: Sequence[Trigger], runtime_url: str,
                 auth: Authenticator, *, keep: int = 200, logs: Callable[[str], str] | None = None) -> None:
        self.bus, self.state, self.topic, self.triggers = bus, state, topic, list(triggers)
        self.runtime_url, self.logs, self.auth = runtime_url, logs, auth
        self.health = Health({"bus": bus.ping, "store": state.ping})
        self.events: deque[dict[str, Any]] = deque(maxlen=keep)
        self.counts: dict[str, int] = {}
        self.edges: dict[str, dict[str, Any]] = {}
        self.lag: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._consumer = bus.subscribe([topic], f"{topic}.dashboard.{uuid.uuid4().hex[:12]}", start="latest")
        self._threads = [threading.Thread(target=self._follow, name="dashboard-events", daemon=True),
                         threading.Thread(target=self._measure_lag, name="dashboard-lag", daemon=True)]

    def start(self, wait: float = 30.0) -> None:
        """Start following; returns once the bus assigned partitions (or after ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while not self._consumer.assignment() and time.monotonic() < deadline:
            self._take(self._consumer.poll(0.2))
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop following. The threads only read (nothing to flush), so with the bus away a stop does not wait
        for their calls to time out: they are daemons and end with the process."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if not any(thread.is_alive() for thread in self._threads):
            self._consumer.close()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self._take(self._consumer.poll(0.3))
            except CascadeError:  # the bus is away for a moment; the page says so by going stale
                self._stop.wait(1.0)

    def _take(self, records: list[Record]) -> None:
        for record in records:
            try:
                event = record.event()
            except CascadeError:
                continue
            data = event.get_data()
            row = {"id": event["id"], "type": event["type"], "source": event["source"],
                   "subject": event.get("subject") or "", "time": event.get("time") or "",
                   "project": event.get("project") or "", "seen": time.time()}
            with self._lock:
                self.events.appendleft(row)
                self.counts[event["type"]] = self.counts.get(event["type"], 0) + 1
                if event["type"] == HEARTBEAT and isinstance(data, dict):
                    self.edges[str(data.get("cluster"))] = {**data, "time": row["time"], "seen": row["seen"]}

    def _measure_lag(self) -> None:
        while not self._stop.is_set():
            for t in self.triggers:
                try:
                    self.lag[t.name] = trigger_lag(self.bus, t, self.topic)
                except CascadeError:
                    self.lag.pop(t.name, None)
            self._stop.wait(2.0)

    def snapshot(self, caller: Identity) -> dict[str, Any]:
        """What the page shows ``caller``; with the state store down, what needs it is left empty and
        ``health`` says which dependency is away."""
        _, health = self.health.report(max_age=2.0)  # polled every 300 ms: do not ping the bus each time
        store_up = health["checks"].get("store") == "ok"
        triggers = []
        for t in self.triggers:
            stats = (self.state.get_record("trigger-stats", t.name) if store_up else None) or {}
            triggers.append({"name": t.name, "subscriber": t.subscriber, "ordering": t.ordering,
                             "deadLetterTopic": t.dead_letter_topic, "lag": self.lag.get(t.name),
                             **{k: int(stats.get(k, 0)) for k in ("delivered", "retried", "dead_lettered", "in_flight")}})
        jobs = sorted(self.state.find_records("job") if store_up else [], key=lambda j: str(j.get("submitted", "")),
                      reverse=True)
        jobs = [j for j in jobs if caller.sees(j.get("project"))][:50]
        models = [{"model": name, "versions": [{k: v.get(k, "") for k in ("version", "stage", "format", "metrics")}
                                               for v in sorted(mine, key=lambda v: version_key(v["version"]))]}
                  for name, versions in sorted((Registry(self.state).models() if store_up else {}).items())
                  if (mine := [v for v in versions if caller.sees(v.get("project", "default"))])]
        with self._lock:
            events = [e for e in self.events if caller.sees(e["project"])]
            counts, edges = dict(self.counts), dict(self.edges)
        token = self.auth.platform_token
        routes = runtime_admin(self.runtime_url, "/_runtime/models", token, 1.0) or {}
        if not caller.platform:  # a project sees its own parts; the platform-wide ones need the platform
            counts, triggers, edges = {}, [], {}
            for e in events:
                counts[e["type"]] = counts.get(e["type"], 0) + 1
            routes = {m: r for m, r in routes.items() if any(x["model"] == m for x in models)}
        shown = []
        for record in (self.state.find_records("experiment") if store_up else [])[-20:]:
            if caller.sees(record.get("project")):
                try:
                    state = experiments.read(self.state, str(record["id"]))
                except NotFound:
                    continue
                shown.append({**experiments.summary(state), "points": experiments.progress(state)})
        return {"now": time.time(), "events": events, "eventCounts": counts, "triggers": triggers,
                "experiments": shown,
                "project": caller.project,
                "services": runtime_admin(self.runtime_url, "/_runtime/services", token, 1.0) if caller.platform else [],
                "routes": routes,
                "jobs": [{"id": j.get("id"), "kind": j.get("kind", ""), "project": j.get("project", ""),
                          "status": j.get("status", ""), "submitted": j.get("submitted", ""),
                          "framework": (j.get("spec") or {}).get("framework", ""), "metrics": j.get("metrics", {}),
                          "reason": j.get("reason", "")} for j in jobs],
                "models": models, "edges": edges, "health": health}

    def app(self) -> FastAPI:
        api = FastAPI(title="Cascade dashboard", docs_url=None, redoc_url=None, openapi_url=None)
        page = PAGE.read_text()

        @api.exception_handler(InvalidInput)
        async def refused(request: Request, exc: InvalidInput) -> JSONResponse:
            return problem(exc)

        @api.get("/", response_class=HTMLResponse)
        def index() -> HTMLResponse:  # no data in it: the page asks /api/* with the token typed into it
            return HTMLResponse(page, headers={"Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                                               "style-src 'unsafe-inline'; frame-ancestors 'none'",
                                               "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

        @api.get("/api/snapshot")
        async def snapshot(request: Request) -> dict[str, Any]:
            caller = await run_in_threadpool(self.auth.require, request.headers, "read")
            return await run_in_threadpool(self.snapshot, caller)

        @api.get("/readyz")
        def readyz() -> JSONResponse:
            ready, body = self.health.report()
            return JSONResponse(body, status_code=200 if ready else 503)

        @api.get("/api/jobs/{job_id}/logs", response_class=PlainTextResponse)
        def job_logs(job_id: str, request: Request) -> PlainTextResponse:
            caller = self.auth.require(request.headers, "read")
            job = self.state.get_record("job", job_id) or {}
            if self.logs is None or not job or not caller.sees(job.get("project")):
                return PlainTextResponse(f"no logs of job {job_id!r} here", status_code=404)
            try:
                return PlainTextResponse(self.logs(job_id)[-20000:])
            except CascadeError as exc:
                return PlainTextResponse(str(exc), status_code=404)

        return api
