"""Both delivery clients send a request once more when the server dropped it on a kept connection; the loop
client is tested on the event loop the dispatcher runs it on (``cascade.core.loops``: uvloop where installed)."""

from __future__ import annotations

import threading
from collections.abc import Coroutine, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import uvloop

from cascade.core.loops import new_loop
from cascade.events.dispatcher.http import AsyncHTTP, DeliveryError, Response, ThreadLocalHTTP


class DropsTheSecondRequest(BaseHTTPRequestHandler):
    """Answers a connection's first request and keeps it open; drops its second without an answer (as a server
    does that closed an idle keep-alive connection just as the request came)."""

    protocol_version = "HTTP/1.1"
    seen: list[int] = []  # per request: its number on its connection

    def setup(self) -> None:
        super().setup()
        self.on_this_connection = 0

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.on_this_connection += 1
        self.seen.append(self.on_this_connection)
        if self.on_this_connection > 1:
            self.close_connection = True
            return
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def url() -> Iterator[str]:
    DropsTheSecondRequest.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), DropsTheSecondRequest)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_the_thread_client_resends_a_request_dropped_on_a_kept_connection(url: str) -> None:
    client = ThreadLocalHTTP()
    try:
        answers = [client.post(url, {}, b"{}", 5.0) for _ in range(2)]
    finally:
        client.close()
    assert [a.status for a in answers] == [200, 200]
    assert DropsTheSecondRequest.seen == [1, 2, 1], "dropped on the kept connection, answered on a fresh one"


def on_the_dispatchers_loop(work: Coroutine[Any, Any, Any]) -> Any:
    loop = new_loop()
    try:
        return loop.run_until_complete(work)
    finally:
        loop.close()


def test_the_dispatcher_delivers_on_uvloop_where_it_is_installed() -> None:
    loop = new_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_the_loop_client_resends_a_request_dropped_on_a_kept_connection(url: str) -> None:
    async def two() -> list[Response]:
        client = AsyncHTTP(1)
        try:
            return [await client.post(url, {}, b"{}", 5.0) for _ in range(2)]
        finally:
            await client.close()

    assert [a.status for a in on_the_dispatchers_loop(two())] == [200, 200]
    assert DropsTheSecondRequest.seen == [1, 2, 1], "dropped on the kept connection, answered on a fresh one"


def test_the_loop_client_reports_a_server_that_is_not_there() -> None:
    async def one() -> None:
        client = AsyncHTTP(1)
        try:
            await client.post("http://127.0.0.1:9/", {}, b"{}", 5.0)
        finally:
            await client.close()

    with pytest.raises(DeliveryError):
        on_the_dispatchers_loop(one())
