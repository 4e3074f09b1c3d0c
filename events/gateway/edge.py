"""The gateway's edge endpoints: what a remote edge agent reaches over HTTPS with its cluster credential.

``GET /edge/v1/releases`` streams the release entries the cluster sees as Server-Sent Events,
from the position in ``Last-Event-ID`` (a comment every few seconds keeps idle links and
their NAT mappings open, and lets the agent notice a dead link); ``POST /edge/v1/events``
takes the agent's ``model.deployed`` / ``model.deploy_failed`` / ``edge.heartbeat`` back onto
the bus, each only about its own cluster; ``GET /edge/v1/artifacts/<sha256>`` serves the
artifact of a release the cluster sees, with byte ranges so a cut download resumes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response, StreamingResponse

from cascade.core.credentials import bearer
from cascade.core.errors import InvalidInput, NotFound, Unauthorized
from cascade.events.bindings import http as ce_http
from cascade.events.edge import DEPLOYED, FAILED, HEARTBEAT, PREFIX, Feed, frame
from cascade.events.envelope import check_event
from cascade.events.gateway.errors import Conflict, Forbidden, RangeNotSatisfiable

POLL = 0.25  # seconds between looks at the feed while a stream is idle
KEEPALIVE = 5.0  # seconds between comments on an idle stream
RECHECK = 5.0  # seconds between checks that the credential still stands
CHUNK = 256 << 10


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``Range: bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` as (first, last) inclusive; None: the whole file."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        raise InvalidInput("only one byte range (bytes=FIRST-LAST) is served", field="range")
    first_s, dash, last_s = spec.strip().partition("-")
    try:
        if not dash:
            raise ValueError
        if first_s == "":
            first, last = max(0, size - int(last_s)), size - 1
        else:
            first, last = int(first_s), (int(last_s) if last_s else size - 1)
    except ValueError as exc:
        raise InvalidInput(f"range {header!r} is not bytes=FIRST-LAST", field="range") from exc
    if first >= size or first > last:
        raise RangeNotSatisfiable(f"range {header!r} starts past the artifact's {size} bytes", field="range")
    return first, min(last, size - 1)


def add_edge_routes(app: FastAPI, feed: Feed, publish: Callable[[str, str, list[Any]], Any],
                    open_artifact: Callable[[str], Path] | None) -> None:
    """Mount the edge endpoints; ``publish(route, rate_key, events)`` puts events on the bus (202 after)."""

    async def cluster_of(request: Request) -> dict[str, Any]:
        token = bearer(request.headers)
        found = await run_in_threadpool(feed.clusters.lookup, token) if token else None
        if found is None:
            if token and not token.startswith(PREFIX):
                raise Forbidden("edge endpoints take an edge cluster's credential (cascade edge register), "
                                "not a project or platform token")
            raise Unauthorized("send the cluster's credential from `cascade edge register` as a bearer token")
        return found

    @app.get("/edge/v1/releases", tags=["edge"], responses={200: {"content": {"text/event-stream": {}}}})
    async def releases(request: Request, after: int | None = None) -> StreamingResponse:
        """The model releases this cluster sees, as Server-Sent Events from ``Last-Event-ID`` (or ``?after=``) on."""
        cluster = await cluster_of(request)
        raw = request.headers.get("last-event-id", "")
        try:
            position = int(raw) if raw.strip() else (after or 0)
            if position < 0:
                raise ValueError
        except ValueError as exc:
            raise InvalidInput("Last-Event-ID is the number of the last release entry handled", field="last-event-id") \
                from exc
        name, labels, token = str(cluster["name"]), dict(cluster["labels"]), bearer(request.headers)
        await run_in_threadpool(feed.note, name)

        async def stream() -> AsyncIterator[str]:
            pos, sent, checked = position, time.monotonic(), time.monotonic()
            yield ": connected\n\n"
            while not await request.is_disconnected():
                entries, head = await run_in_threadpool(feed.for_cluster, name, labels, pos)
                for entry in entries:
                    yield frame(entry)
                    sent = time.monotonic()
                pos = head
                if time.monotonic() - sent >= KEEPALIVE:
                    yield ": keepalive\n\n"
                    sent = time.monotonic()
                if time.monotonic() - checked >= RECHECK:
                    if await run_in_threadpool(feed.clusters.lookup, token) is None:
                        return  # revoked: the agent's reconnect gets 401
                    checked = time.monotonic()
                await asyncio.sleep(POLL)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    @app.post("/edge/v1/events", status_code=202, tags=["edge"])
    async def edge_events(request: Request) -> dict[str, Any]:
        """The agent's deploy outcomes and heartbeats (CloudEvents, structured or batch), each about this cluster."""
        cluster = await cluster_of(request)
        name = str(cluster["name"])
        events = ce_http.parse(request.headers, await request.body())
        for i, event in enumerate(events):
            at = f"/{i}" if len(events) > 1 else ""
            data = event.get_data()
            if event["type"] not in (DEPLOYED, FAILED, HEARTBEAT):
                raise Forbidden(f"an edge agent sends model.deployed, model.deploy_failed or edge.heartbeat, not "
                                f"{event['type']}", field=f"{at}/type")
            if not isinstance(data, dict) or data.get("cluster") != name:
                raise Forbidden(f"this credential speaks for cluster {name!r} only", field=f"{at}/data/cluster")
            if event["type"] != HEARTBEAT:
                if data.get("target") != "edge":
                    raise InvalidInput("an edge agent's outcome has target edge", field=f"{at}/data/target")
                release = await run_in_threadpool(feed.release, str(data.get("model")), str(data.get("version")))
                if release is None or not any(feed.sees(e, name, cluster["labels"]) for e in release["entries"]):
                    raise Forbidden(f"no release {data.get('model')} {data.get('version')} reached {name!r}",
                                    field=f"{at}/data/version")
                event["project"] = release["project"]
            event["source"] = f"/cascade/edge/{name}"
            try:
                check_event(event)
            except InvalidInput as exc:
                exc.field = f"{at}{exc.field}"
                raise
        beats: list[dict[str, Any]] = [e.get_data() or {} for e in events if e["type"] == HEARTBEAT]
        for beat in beats:
            await run_in_threadpool(feed.note, name, serving=beat.get("serving"), position=beat.get("position"),
                                    offline=beat.get("offline"), endpoint=beat.get("endpoint"))
        if not beats:
            await run_in_threadpool(feed.note, name)
        result: dict[str, Any] = await publish("/edge/v1/events", f"edge:{name}", events)
        return result

    @app.get("/edge/v1/artifacts/{sha256}", tags=["edge"])
    async def artifact(sha256: str, request: Request) -> Response:
        """The artifact of a release this cluster sees; ``Range`` resumes a cut download."""
        cluster = await cluster_of(request)
        record = await run_in_threadpool(feed.artifact, sha256)
        if record is None or open_artifact is None or not any(
                feed.sees(e, str(cluster["name"]), cluster["labels"]) for e in record["entries"]):
            raise NotFound(f"no artifact {sha256} in a release this cluster sees")
        path = await run_in_threadpool(open_artifact, str(record["uri"]))
        if not path.is_file():
            raise Conflict("this artifact is a folder; the edge path delivers single-file artifacts "
                           "(package the folder as one file, or serve it from an artifact host)", field="sha256")
        size = path.stat().st_size
        span = byte_range(request.headers.get("range"), size)
        first, last = span or (0, size - 1)
        headers = {"accept-ranges": "bytes", "etag": f'"{sha256}"', "content-length": str(last - first + 1)}
        if span is not None:
            headers["content-range"] = f"bytes {first}-{last}/{size}"

        def chunks() -> Any:
            with path.open("rb") as f:
                f.seek(first)
                left = last - first + 1
                while left > 0:
                    block = f.read(min(CHUNK, left))
                    if not block:
                        return
                    left -= len(block)
                    yield block

        return StreamingResponse(chunks(), status_code=206 if span else 200, headers=headers,
                                 media_type="application/octet-stream")
