"""The header deadline, one timer per connection: a slow head is cut off, a busy keep-alive connection is not."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cascade.core.asgi import ServerThread
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
        while time.monotonic() < deadline:  # requests in time, for longer than one deadline
            conn.sendall(REQUEST)
            assert b"200 OK" in answer(conn)
            time.sleep(TIMEOUT / 5)
        conn.sendall(b"GET / HTTP/1.1\r\n")  # then a head that stops
        assert closed_within(conn, 5) < TIMEOUT + 1.5
