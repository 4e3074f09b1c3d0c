"""The trust boundary every Cascade HTTP server sits behind, as one ASGI middleware.

Each check answers with a JSON problem body before the application sees the request:

* ``Host`` must name this server (an allowlist; ``*`` allows any), and a browser's ``Origin``
  must too, so a page on another site cannot reach a loopback port by DNS rebinding;
* a path with control characters (``%0d%0a`` and friends) is refused, so nothing smuggles a
  header or a second request past a proxy;
* a body over ``max_body`` is refused from its ``Content-Length`` or, chunked, while it streams
  (:class:`~cascade.core.errors.TooLarge` is raised inside the app's ``receive``);
* an unhandled error becomes a JSON 500 and is counted (``on_error``), never a traceback;
* a client that leaves before its body ends gets no answer (nobody is listening) and is no error.

The header-read timeout lives a layer lower, in the server's protocol (:func:`header_timeout_protocol`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from cascade.core.errors import TooLarge

log = logging.getLogger("cascade.http")
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")  # control characters, refused in a (decoded) path
_CHECKED = frozenset((b"host", b"origin", b"content-length"))


def _hostname(value: str) -> str:
    """``host[:port]`` (or ``[v6]:port``) -> the lower-case host."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_hosts(listen: str, extra: Sequence[str] = ()) -> list[str]:
    """The loopback names, the listen address unless it is a wildcard, and ``extra``."""
    hosts = [*LOCAL_HOSTS, *extra]
    if listen not in ("0.0.0.0", "::", ""):
        hosts.append(listen)
    return [h.lower() for h in hosts]


def host_refusal(hosts: Sequence[str], host: str, origin: str | None) -> tuple[int, str, str, str] | None:
    """(status, error, message, field) when ``Host`` or a browser's ``Origin`` does not name this server."""
    if "*" in hosts:
        return None
    if _hostname(host) not in hosts:
        return 400, "InvalidHost", "the Host header does not name this server", "host"
    if origin and origin != "null" and (urlsplit(origin).hostname or "").lower() not in hosts:
        return 403, "ForbiddenOrigin", f"requests from origin {origin!r} are not allowed", "origin"
    return None


async def answer(send: Send, status: int, error: str, message: str, field: str = "",
                 headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = {"error": error, "message": message, **({"field": field} if field else {})}
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": raw})


class HTTPGuard:
    def __init__(self, app: ASGIApp, *, hosts: Sequence[str], max_body: int,
                 on_error: Callable[[int, str], None] | None = None) -> None:
        self.app, self.max_body, self.on_error = app, max_body, on_error
        self.hosts = [h.lower() for h in hosts]

    def _refusal(self, scope: Scope) -> tuple[int, str, str, str] | None:
        raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
        if _CONTROL.search(unquote_to_bytes(raw) if b"%" in raw else raw):
            return 400, "InvalidPath", "control characters are not allowed in the path", "path"
        wanted: dict[bytes, bytes] = {}  # only the headers the checks read (servers give names in lower case)
        for name, value in scope.get("headers", ()):
            if name in _CHECKED:
                wanted[name] = value
        origin = wanted.get(b"origin")
        refused = host_refusal(self.hosts, wanted.get(b"host", b"").decode("latin-1"),
                               None if origin is None else origin.decode("latin-1"))
        if refused is not None:
            return refused
        length = wanted.get(b"content-length", b"").decode("latin-1")
        if length.isdigit() and int(length) > self.max_body:
            return 413, "TooLarge", f"body of {length} bytes is over the {self.max_body}-byte limit", "content-length"
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            if self.on_error:
                self.on_error(refusal[0], scope["path"])
            await answer(send, *refusal)
            return
        seen, started, over = 0, False, False

        async def limited() -> Message:
            nonlocal seen, over
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                over = True
                raise TooLarge(f"body is over the {self.max_body}-byte limit", field="content-length")
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if over:  # close instead of reading the rest of an oversized body
                    message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        try:
            await self.app(scope, limited, tracked)
        except TooLarge as exc:
            if not started:
                await answer(send, 413, "TooLarge", exc.message, exc.field, [(b"connection", b"close")])
            if self.on_error:
                self.on_error(413, scope["path"])
        except ClientDisconnect:  # gone mid-body: nothing was accepted, and there is nobody to answer
            log.info("client left before its body ended: %s %s", scope.get("method"), scope.get("path"))
        except Exception:
            log.exception("unhandled error serving %s %s", scope.get("method"), scope.get("path"))
            if self.on_error:
                self.on_error(500, scope["path"])
            if not started:
                await answer(send, 500, "InternalError", "the server failed to handle this request; it was logged")


class _HeaderTimeout:
    """Closes a connection whose request head does not arrive in time (mixed into uvicorn's HTTP protocols).

    uvicorn times out idle keep-alive connections but not a client that sends its headers one
    byte a minute; 200 such connections would otherwise stay open for ever. Both protocols set
    ``cycle`` once a request's head is complete.
    """

    header_timeout = 10.0
    cycle: Any
    loop: Any
    transport: Any
    _waiting: tuple[object, float]  # the cycle whose successor's head is awaited, and since when

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._waiting = (self.cycle, self.loop.time())
        self.loop.call_later(self.header_timeout, self._header_deadline)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        self._waiting = (self.cycle, self.loop.time())  # the connection's one timer checks this wait when it fires

    def _header_deadline(self) -> None:
        """One timer per connection, not one per request: it closes a connection still waiting past its deadline,
        else it looks again when the current (or next) wait could end."""
        if self.transport.is_closing():
            return
        waiting_for, since = self._waiting
        left = self.header_timeout
        if self.cycle is waiting_for:
            left = since + self.header_timeout - self.loop.time()
            if left <= 0:
                self.transport.close()
                return
        self.loop.call_later(left, self._header_deadline)


class HeaderTimeoutH11(_HeaderTimeout, H11Protocol):
    """uvicorn's pure-Python h11 protocol with the header timeout."""


def header_timeout_protocol(header_timeout: float) -> type:
    """uvicorn's httptools protocol (its C parser: about three times cheaper per request than h11) with the header
    timeout; h11's where httptools is not installed."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        base: type = HeaderTimeoutH11
    else:
        base = type("HeaderTimeoutHttpTools", (_HeaderTimeout, HttpToolsProtocol), {})
    return type("HeaderTimeoutHTTP", (base,), {"header_timeout": header_timeout})
