"""``POST /events``, the gateway's hot path, served as a plain ASGI endpoint.

Every event a client publishes passes here, and FastAPI's per-request machinery (the request
object, dependency resolution, response serialisation) cost about as much again as the rest of
the request. So the route stays an ordinary, documented FastAPI route (its OpenAPI entry, the
HTTP guard and the app's middleware all apply), but its requests go straight to this endpoint,
which does what ``Gateway.accept_events`` says and answers refusals with the same problem bodies
(``errors.problem``) as every other route.
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


def serve_plainly(app: FastAPI, path: str, endpoint: ASGIApp) -> None:
    """Serve the app's documented route at ``path`` with ``endpoint`` instead of its FastAPI handler."""
    route = next(r for r in app.router.routes if isinstance(r, APIRoute) and r.path == path)
    route.app = endpoint
