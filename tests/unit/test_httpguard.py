"""The HTTP guard's own parts: the header deadline (one timer per connection: a slow head is cut off, a busy
keep-alive connection is not), and a client that leaves before its body ends (no answer, no error)."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from cascade.core.asgi import ServerThread
from cascade.core.httpguard import HTTPGuard
from cascade.core.ports import free_port

TIMEOUT = 0.5
REQUEST = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def server() -> Iterator[ServerThread]:
    s = ServerThread(ok, port=free_port(), lifespan="off", header_timeout=TIMEOUT).start()
    yield s
    s.stop()


def answer(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"ok"):
        chunk = conn.recv(4096)
        assert chunk, "the server closed a connection that was sending requests in time"
        data += chunk
    return data


def stays_open(conn: socket.socket, seconds: float) -> None:
    """Idle for ``seconds``, a gap shorter than the deadline: the server must neither answer nor close."""
    conn.settimeout(seconds)
    with pytest.raises(TimeoutError):
        conn.recv(1)
    conn.settimeout(None)


def closed_within(conn: socket.socket, seconds: float) -> float:
    started = time.monotonic()
    conn.settimeout(seconds)
    assert conn.recv(1) == b"", "the server closed the connection"
    return time.monotonic() - started


def test_a_head_that_never_ends_is_cut_off(server: ServerThread) -> None:
    with socket.create_connection((server.host, server.port)) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        assert closed_within(conn, 5) < TIMEOUT + 1.5


def test_the_next_head_on_a_kept_alive_connection_has_its_own_deadline(server: ServerThread) -> None:
    with socket.create_connection((server.host, server.port)) as conn:
        deadline = time.monotonic() + 3 * TIMEOUT
        while time.monotonic() < deadline:  # requests in time, each after an idle gap, for longer than one deadline
            conn.sendall(REQUEST)
            assert b"200 OK" in answer(conn)
            stays_open(conn, TIMEOUT / 5)
        conn.sendall(b"GET / HTTP/1.1\r\n")  # then a head that stops
        assert closed_within(conn, 5) < TIMEOUT + 1.5


def test_a_client_gone_before_its_body_ends_gets_no_answer_and_is_no_error(caplog: pytest.LogCaptureFixture) -> None:
    bodies: list[bytes] = []
    errors: list[tuple[int, str]] = []

    async def hook(request: Request) -> Response:
        bodies.append(await request.body())
        return Response(status_code=202)

    app = Starlette(routes=[Route("/hook", hook, methods=["POST"])], middleware=[  # inside the app, as services add it
        Middleware(HTTPGuard, hosts=("127.0.0.1",), max_body=1024, on_error=lambda s, path: errors.append((s, path)))])
    messages: list[dict[str, Any]] = [{"type": "http.request", "body": b'{"a":', "more_body": True},
                                      {"type": "http.disconnect"}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/hook", "raw_path": b"/hook", "query_string": b"",
             "root_path": "", "headers": [(b"host", b"127.0.0.1")]}
    with caplog.at_level(logging.INFO, logger="cascade.http"):
        asyncio.run(app(scope, receive, send))
    assert sent == [] and bodies == [] and errors == []
    assert [r.levelno for r in caplog.records] == [logging.INFO] and "left before its body ended" in caplog.text
