"""The gateway's FastAPI application: routes, authentication, limits, publishing.

Every accepted request answers 202 only after its events are durably on the bus; a bus
outage answers 503 with Retry-After and nothing is published. A rejected batch publishes
nothing. See ``docs/gateway.md`` for the endpoints and their error bodies.

The sync/async boundary: every state-store and bus call runs in a worker thread
(``run_in_threadpool``) or through the group committer's own thread, never on the event loop,
so a slow store (another writer holding SQLite's lock, a Redis failover) delays only the
requests that need it, not ``/healthz`` or requests already validated.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cloudevents.http import CloudEvent
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from cascade.core.credentials import bearer, matches, reports_for
from cascade.core.errors import CascadeError, InvalidInput, NotFound, RetryableError, Unauthorized
from cascade.core.httpguard import LOCAL_HOSTS, HTTPGuard
from cascade.core.jsonlimits import loads
from cascade.core.settings import GatewaySettings
from cascade.events import experiments, jobrecords
from cascade.events.bindings import http as ce_http
from cascade.events.bus import EventBus
from cascade.events.bus.batching import GroupCommitter
from cascade.events.dedup import DeliveryLog
from cascade.events.edge import Feed
from cascade.events.envelope import check_event, new_event
from cascade.events.gateway import webhooks
from cascade.events.gateway.edge import add_edge_routes
from cascade.events.gateway.errors import Forbidden, problem
from cascade.events.gateway.ingest import EventsEndpoint, serve_plainly
from cascade.events.gateway.jobs import Jobs
from cascade.events.gateway.metrics import GatewayMetrics
from cascade.events.gateway.ratelimit import RateLimiter
from cascade.events.health import Health
from cascade.events.identity import Authenticator, Identity, Projects, may_publish
from cascade.events.sources import labelling
from cascade.events.sources.connections import Connections, public
from cascade.stores import StateStore

JobCheck = Callable[[str, dict[str, Any], str], list[str]]  # (kind, spec, project) -> warnings; raises to refuse

_PROBLEM = {"application/json": {"schema": {"type": "object", "properties": {
    "error": {"type": "string"}, "message": {"type": "string"}, "field": {"type": "string"}, "schema": {"type": "string"}}}}}
ACCEPTED: dict[int | str, dict[str, Any]] = {
    202: {"description": "Durably on the bus"},
    **{code: {"description": text, "content": _PROBLEM} for code, text in [
        (400, "Malformed request or CloudEvent"), (401, "Missing or wrong token or signature"),
        (403, "Token used outside its project or scopes, or for a platform event type"), (413, "Body over the size limit"),
        (415, "Content type is not a CloudEvents mode"), (422, "Data does not match its schema"),
        (429, "Project over its rate limit"), (503, "Bus unavailable; nothing was stored")]},
}


def _body_doc(*types: str) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {t: {"schema": {"type": "object"}} for t in types}}}


class Gateway:
    """What the routes share: bus, store, limits, metrics."""

    def __init__(self, bus: EventBus, store: StateStore, settings: GatewaySettings, topic: str,
                 platform_token: str = "", check_job: JobCheck | None = None,
                 poke: Callable[[str], None] | None = None) -> None:
        self.bus, self.store, self.settings, self.topic = bus, store, settings, topic
        self.connections, self.poke = Connections(store), poke or (lambda _id: None)
        self.auth = Authenticator(Projects(store), platform_token)
        self.check_job = check_job
        self.committer = GroupCommitter(bus)
        self.limiter = RateLimiter(settings.rate_per_second, settings.burst)
        self.metrics = GatewayMetrics()
        self.jobs = Jobs(store)
        self.deliveries = DeliveryLog(store, settings.dedup_capacity)

    async def body(self, request: Request) -> bytes:
        """The request body; the HTTP guard has already held it to ``max_body_bytes`` while it streamed."""
        return await request.body()

    async def identity(self, headers: Mapping[str, str], scope: str) -> Identity:
        if self.auth.knows(headers):  # answered from memory: no hand-off to a thread and back
            return self.auth.require(headers, scope)
        return await run_in_threadpool(self.auth.require, headers, scope)

    async def project(self, request: Request, scope: str) -> str:
        """The project a request acts for: the token's, or for the platform ``?project=`` (default ``default``)."""
        identity = await self.identity(request.headers, scope)
        return identity.project or request.query_params.get("project", "default")

    async def accept_events(self, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
        """``POST /events``: CloudEvents in binary (``ce-`` headers), structured or batch mode, each checked against
        what the token may publish and against its schema, then published (all or none)."""
        identity = await self.identity(headers, "publish")
        events = ce_http.parse(headers, body)
        for i, event in enumerate(events):
            at = f"/{i}" if len(events) > 1 else ""
            owner = event.get("project")
            if identity.platform:
                if not isinstance(owner, str) or not owner:
                    raise InvalidInput("the platform names the project of each event it publishes",
                                       field=f"{at}/project")
            elif owner is not None and owner != identity.project:
                raise Forbidden(f"this token publishes into project {identity.project!r}, not {owner!r}",
                                field=f"{at}/project")
            elif not may_publish(identity, str(event["type"])):
                raise Forbidden(f"{event['type']} is a platform event type; a project token publishes only "
                                "dataset and labelling events (jobs go to POST /v1/jobs)", field=f"{at}/type")
            event["project"] = owner if identity.platform else identity.project
            try:
                check_event(event)
            except InvalidInput as exc:
                exc.field = f"{at}{exc.field}"
                raise
        owner = identity.project or (str(events[0]["project"]) if events else "default")  # an empty batch: nothing
        return await self.publish("/events", owner, events)

    @staticmethod
    def json(body: bytes) -> Any:
        return loads(body)

    async def publish(self, route: str, project: str, events: Sequence[CloudEvent], *, dedup: bool = False) -> dict[str, Any]:
        """Rate-limit, drop already-published webhook deliveries, publish, then answer."""
        fresh = await run_in_threadpool(self.deliveries.fresh, events) if dedup else list(events)
        self.limiter.take(project, max(1, len(fresh)))
        started = time.perf_counter()
        if fresh:
            await self.committer.publish_async(self.topic, fresh)
        if dedup:
            await run_in_threadpool(self.deliveries.remember, fresh)
        self.metrics.published(route, fresh, time.perf_counter() - started)
        return {"accepted": len(fresh), "duplicates": len(events) - len(fresh), "ids": [e["id"] for e in fresh]}


def create_app(bus: EventBus, store: StateStore, settings: GatewaySettings | None = None,
               topic: str = "cascade.events", *, platform_token: str = "", check_job: JobCheck | None = None,
               hosts: Sequence[str] = LOCAL_HOSTS, poke: Callable[[str], None] | None = None,
               public_url: str = "", open_artifact: Callable[[str], Path] | None = None) -> FastAPI:
    """The gateway application over a bus and a state store, behind the HTTP guard.

    ``platform_token`` is the credential the platform's own parts publish with; ``check_job``
    (the training backend's job policy) refuses a submission it could never run; ``hosts`` are
    the names the ``Host`` header may carry; ``poke`` tells the labelling reconciler a connected
    tool sent a webhook; ``public_url`` is where the tools reach this gateway; ``open_artifact`` turns a
    release's artifact URI into the local file edge agents download (None: the edge path serves no artifacts).
    """
    gw = Gateway(bus, store, settings or GatewaySettings(), topic, platform_token, check_job, poke)
    public_url = public_url or f"http://{gw.settings.host}:{gw.settings.port}"
    app = _fastapi(title="Cascade event gateway", version="1",
                   description="CloudEvents, storage notifications, labelling webhooks and job submissions "
                               "in; validated CloudEvents on the bus out.")
    app.state.gateway = gw

    @app.exception_handler(CascadeError)
    async def on_error(request: Request, exc: CascadeError) -> JSONResponse:
        gw.metrics.rejected(request.url.path, exc)
        return problem(exc)

    # inside FastAPI's own error middleware: refusals, streaming body limits and unhandled errors as JSON
    def guard(inner: Any) -> HTTPGuard:
        return HTTPGuard(inner, hosts=hosts, max_body=gw.settings.max_body_bytes, on_error=gw.metrics.refused)

    app.add_middleware(guard)

    @app.post("/events", status_code=202, responses=ACCEPTED, tags=["events"],
              openapi_extra=_body_doc("application/json", ce_http.STRUCTURED, ce_http.BATCH))
    async def post_events(request: Request) -> None:
        """CloudEvents in binary (``ce-`` headers), structured or batch mode."""  # served by EventsEndpoint

    serve_plainly(app, "/events", EventsEndpoint(gw.accept_events, gw.metrics.rejected), guard)

    @app.post("/webhooks/s3", status_code=202, responses=ACCEPTED, tags=["webhooks"],
              openapi_extra=_body_doc("application/json"))
    async def s3(request: Request) -> dict[str, Any]:
        """AWS S3 or MinIO bucket notification (``Records[]``)."""
        project = await gw.project(request, "publish")
        events, ignored = webhooks.s3_events(gw.json(await gw.body(request)), project)
        return {**await gw.publish("/webhooks/s3", project, events, dedup=True), "ignored": ignored}

    @app.post("/webhooks/label-studio", status_code=202, responses=ACCEPTED, tags=["webhooks"],
              openapi_extra=_body_doc("application/json"))
    async def label_studio(request: Request, dataset: str | None = None, connection: str | None = None) -> dict[str, Any]:
        """Label Studio webhook, header ``Authorization: Bearer <token>``. ``cascade sources label-studio connect``
        registers it with ``?connection=``; wired by hand, ``?dataset=`` names the dataset the labels are for."""
        identity = await gw.identity(request.headers, "publish")
        project = identity.project or request.query_params.get("project", "default")
        if connection is not None:
            record = await run_in_threadpool(gw.connections.get, connection, project)
            dataset = str(record.get("dataset") or "") or None
        events = webhooks.label_studio_events(gw.json(await gw.body(request)), project, dataset, connection)
        reply = await gw.publish("/webhooks/label-studio", project, events, dedup=True)
        if connection is not None:
            gw.poke(connection)
        return reply

    @app.post("/webhooks/cvat", status_code=202, responses=ACCEPTED, tags=["webhooks"],
              openapi_extra=_body_doc("application/json"))
    async def cvat(request: Request, connection: str | None = None, project: str = "default") -> dict[str, Any]:
        """CVAT webhook, signed with ``X-Signature-256``: with ``?connection=`` by that connection's own secret
        (``cascade sources cvat connect``), else by the platform's ``cvat_secret``, for project ``default`` only."""
        body = await gw.body(request)
        signature = request.headers.get("x-signature-256")
        if connection is not None:
            record = await run_in_threadpool(gw.connections.get, connection)
            webhooks.verify_cvat_signature(str(record.get("secret") or ""), body, signature)
            gw.json(body)
            gw.poke(connection)  # completion is read from CVAT's jobs, never trusted from a body
            return {"accepted": 0, "duplicates": 0, "ids": [], "reconciling": connection}
        webhooks.verify_cvat_signature(gw.settings.cvat_secret, body, signature)
        if project != "default":
            raise Forbidden("the platform's CVAT secret signs for project 'default' only; give another project its "
                            "own secret with: cascade sources cvat connect", field="project")
        events = webhooks.cvat_events(gw.json(body), project)
        return await gw.publish("/webhooks/cvat", project, events, dedup=True)

    @app.post("/v1/sources/{tool}", status_code=201, tags=["sources"], openapi_extra=_body_doc("application/json"))
    async def connect_source(tool: str, request: Request) -> dict[str, Any]:
        """Connect a Label Studio (``url, apiKey, projectId, dataset``) or CVAT (``url, username, password,
        projectId | taskId, dataset``) project to a dataset: the webhook is registered in the tool."""
        if tool not in ("label-studio", "cvat"):
            raise NotFound(f"no source kind {tool!r}: label-studio or cvat")
        project = await gw.project(request, "publish")
        body = gw.json(await gw.body(request))
        record = await run_in_threadpool(labelling.connect, gw.connections, tool, project, body, public_url)
        gw.poke(str(record["id"]))
        return public(record)

    @app.get("/v1/sources", tags=["sources"])
    async def list_sources(request: Request) -> list[dict[str, Any]]:
        """The project's connected labelling tools (never their credentials)."""
        identity = await gw.identity(request.headers, "read")
        records = await run_in_threadpool(gw.connections.list, identity.project)
        return [public(r) for r in records]

    @app.delete("/v1/sources/{conn_id}", tags=["sources"])
    async def disconnect_source(conn_id: str, request: Request) -> dict[str, Any]:
        """Remove the tool's webhook, revoke its token and forget the connection."""
        identity = await gw.identity(request.headers, "publish")
        record = await run_in_threadpool(gw.connections.get, conn_id, identity.project)
        return await run_in_threadpool(labelling.disconnect, gw.connections, record)

    @app.post("/v1/jobs", status_code=202, responses=ACCEPTED, tags=["jobs"],
              openapi_extra=_body_doc("application/json"))
    async def submit_job(request: Request) -> dict[str, Any]:
        """Submit ``{"kind": "training"|"finetune", "spec": {...}}``; returns the job id."""
        project = await gw.project(request, "submit")
        body = gw.json(await gw.body(request))
        job, event, new = await run_in_threadpool(gw.jobs.prepare, project, body, request.headers.get("idempotency-key"),
                                                  gw.check_job)
        if new:
            try:
                await gw.publish("/v1/jobs", project, [event])
            except (RetryableError, InvalidInput):
                await run_in_threadpool(gw.jobs.forget, job["id"])
                raise
        return {"jobId": job["id"], "status": job["status"], "eventId": event["id"],
                **({"warnings": job["warnings"]} if job.get("warnings") else {})}

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    async def get_job(job_id: str, request: Request) -> dict[str, Any]:
        """A job's record: spec, status and history."""
        identity = await gw.identity(request.headers, "read")
        return await run_in_threadpool(gw.jobs.get, identity.project, job_id)

    @app.get("/v1/jobs", tags=["jobs"])
    async def list_jobs(request: Request, status: str | None = None) -> list[dict[str, Any]]:
        """The token's project's jobs, optionally by status."""
        return await run_in_threadpool(gw.jobs.list, await gw.project(request, "read"), status)

    @app.post("/v1/jobs/{job_id}/reports", status_code=202, responses=ACCEPTED, tags=["jobs"],
              openapi_extra={"requestBody": {"required": True, "content": {  # JSON lines
                  "text/plain": {"schema": {"type": "string"}}}}})
    async def report_metrics(job_id: str, request: Request) -> dict[str, Any]:
        """A running job's new ``metrics.jsonl`` lines, each a ``trial.reported`` event (on Kubernetes the
        metrics-reporter beside the job's pods posts them with the job's report credential)."""
        token = bearer(request.headers)
        if not (reports_for(token, gw.auth.platform_token, job_id) or matches(token, gw.auth.platform_token)):
            if await run_in_threadpool(gw.auth.identify, token) is not None:
                raise Forbidden("a job's metrics are reported with its own report credential, not a project token")
            raise Unauthorized("send the job's report credential (Secret <job>-report beside its pods) as a bearer token")
        job = await run_in_threadpool(jobrecords.get, gw.store, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        project = str(job["project"])
        events = [new_event("trial.reported", {"jobId": job_id, "step": step, "metrics": values},
                            source="/cascade/api/jobs", id=f"report-{job_id}-{step}", subject=job_id,
                            partitionkey=job_id, extensions={"project": project})
                  for step, values in experiments.report_rows(await gw.body(request))]
        return await gw.publish("/v1/jobs/reports", project, events, dedup=True)

    @app.post("/v1/experiments", status_code=202, responses=ACCEPTED, tags=["experiments"],
              openapi_extra=_body_doc("application/json"))
    async def submit_experiment(request: Request) -> dict[str, Any]:
        """Submit a hyper-parameter search (``experiment.v1``); returns its id once experiment.submitted is on the bus."""
        project = await gw.project(request, "submit")
        spec = gw.json(await gw.body(request))
        experiments.check(spec)
        if spec.get("project", project) != project:
            raise Forbidden(f"this token submits into project {project!r}", field="/spec/project")
        warnings = []
        if gw.check_job is not None:  # each trial is a training job under this project's policy
            warnings = await run_in_threadpool(gw.check_job, "training", spec["trial"], project)
        experiment_id = experiments.new_id()
        event = new_event("experiment.submitted", {"experimentId": experiment_id, "project": project, "spec": spec},
                          source="/cascade/api/experiments", id=f"submit-{experiment_id}", subject=experiment_id,
                          partitionkey=experiment_id, extensions={"project": project})
        reply = await gw.publish("/v1/experiments", project, [event])
        return {"experimentId": experiment_id, "eventId": event["id"], **{k: v for k, v in reply.items() if k != "ids"},
                **({"warnings": warnings} if warnings else {})}

    @app.get("/v1/experiments", tags=["experiments"])
    async def list_experiments(request: Request) -> list[dict[str, Any]]:
        """The token's project's experiments: status, trials by state, the best so far."""
        return await run_in_threadpool(experiments.listed, gw.store, await gw.project(request, "read"))

    @app.get("/v1/experiments/{experiment_id}", tags=["experiments"])
    async def get_experiment(experiment_id: str, request: Request) -> dict[str, Any]:
        """An experiment with every trial: parameters, intermediate values, outcome."""
        project = await gw.project(request, "read")
        state = await run_in_threadpool(experiments.read, gw.store, experiment_id, project)
        return {**experiments.summary(state), "spec": state["spec"], "trials": state["trials"],
                "reason": state.get("reason", "")}

    @app.post("/v1/experiments/{experiment_id}/stop", status_code=202, responses=ACCEPTED, tags=["experiments"])
    async def stop_experiment(experiment_id: str, request: Request) -> dict[str, Any]:
        """Stop an experiment: its running trials are cancelled and it ends with the best trial so far."""
        project = await gw.project(request, "submit")
        await run_in_threadpool(experiments.read, gw.store, experiment_id, project)
        event = new_event("experiment.stopped", {"experimentId": experiment_id, "reason": "stopped on request"},
                          source="/cascade/api/experiments", subject=experiment_id, partitionkey=experiment_id,
                          extensions={"project": project})
        return {"experimentId": experiment_id, **await gw.publish("/v1/experiments", project, [event])}

    add_edge_routes(app, Feed(store), gw.publish, open_artifact)

    @app.get("/healthz", tags=["operations"])
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    health = Health({"bus": gw.bus.ping, "store": gw.store.ping})

    @app.get("/readyz", tags=["operations"])
    async def readyz() -> Response:
        """Ready only when the bus and the state store answer; ``checks`` names each one's state."""
        ready, body = await run_in_threadpool(health.report)
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", tags=["operations"])
    async def metrics(request: Request) -> Response:
        """Prometheus metrics: for loopback clients, anyone else with the platform credential."""
        if not _loopback(request.client.host if request.client else ""):
            gw.auth.require_platform(request.headers)
        return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")

    return app


def _fastapi(**options: Any) -> FastAPI:
    """The app, without FastAPI's own OpenTelemetry instrumentation (from 0.165): the gateway's metrics are
    Prometheus (``/metrics``) and it makes no spans, and asking whether a provider is configured cost every
    request 5 % of its time even with none."""
    try:
        return FastAPI(telemetry={"tracing": False, "metrics": False, "logs": False}, **options)
    except TypeError:  # a FastAPI without native telemetry
        return FastAPI(**options)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "testclient"
