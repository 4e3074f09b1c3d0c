"""``POST /events``, the gateway's hot path, served as a plain ASGI endpoint.

Every event a client publishes passes here, and FastAPI's per-request machinery (the request
object, dependency resolution, response serialisation) and the middleware it is built into (error
and exception middleware, the router, a wrapper around ``send`` per layer) cost about as much again
as the rest of the request. So the route stays an ordinary, documented FastAPI route (its OpenAPI
entry is the app's), but a ``POST`` to it goes from the top of the app straight to the HTTP guard
and this endpoint, which does what ``Gateway.accept_events`` says and answers refusals with the same
problem bodies (``errors.problem``) as every other route. The guard is what the app's stack would
have added for this request: its host, path and body checks and its JSON 500 for an error nobody
handled.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from cascade.core.errors import CascadeError
from cascade.events.gateway.errors import problem


class EventsEndpoint:
    """The ASGI app behind ``POST /events``: ``accept`` is the gateway's ``accept_events``, ``rejected`` counts a
    refusal in its metrics."""

    def __init__(self, accept: Callable[[Mapping[str, str], bytes], Awaitable[dict[str, Any]]],
                 rejected: Callable[[str, CascadeError], None], route: str = "/events") -> None:
        self.accept, self.rejected, self.route = accept, rejected, route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        while True:  # the HTTP guard's receive holds the body to its size limit
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away: nobody to answer, nothing published
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        try:
            reply = await self.accept(Headers(scope=scope), b"".join(chunks))
        except CascadeError as exc:
            self.rejected(self.route, exc)
            await problem(exc)(scope, receive, send)
            return
        body = orjson.dumps(reply)
        await send({"type": "http.response.start", "status": 202,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


class FastLane:
    """The top of an app: ``POST path`` to ``endpoint``, every other request (and lifespan) through ``stack``."""

    def __init__(self, stack: ASGIApp, path: str, endpoint: ASGIApp) -> None:
        self.stack, self.path, self.endpoint = stack, path, endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            path, root = scope["path"], scope.get("root_path", "")
            if path == self.path or (root and path == root + self.path):
                await self.endpoint(scope, receive, send)
                return
        await self.stack(scope, receive, send)


def serve_plainly(app: FastAPI, path: str, endpoint: ASGIApp, guard: Callable[[ASGIApp], Any]) -> None:
    """Serve ``POST path``, a documented route of ``app``, with ``endpoint`` behind ``guard`` instead of its FastAPI
    handler behind the app's middleware (``guard`` must make the checks that middleware makes)."""
    route = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == path)
    route.app = endpoint  # a request the lane does not take still gets the endpoint
    build = app.build_middleware_stack
    lane = guard(endpoint)

    def build_with_lane() -> ASGIApp:
        return FastLane(build(), path, lane)

    app.build_middleware_stack = build_with_lane  # type: ignore[method-assign]
