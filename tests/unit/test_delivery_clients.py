"""The two delivery clients (libcurl on a thread, libcurl on an event loop) behave alike: a request the server dropped
on a kept connection is sent once more, the request goes out as given and the whole answer comes back, timeouts,
other schemes, proxies from the environment and untrusted certificates are handled as the module says. The loop
client is tested on the event loop the dispatcher runs it on (``cascade.core.loops``: uvloop where installed)."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Coroutine, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import uvloop

from cascade.core.loops import new_loop
from cascade.events.dispatcher.http import AsyncHTTP, DeliveryError, DeliveryTimeout, Response, ThreadLocalHTTP
from tests.helpers.subscriber import Subscriber
from tests.helpers.tls import self_signed


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


def test_the_loop_client_sends_on_a_new_connection_when_every_kept_one_it_tries_is_dead(url: str) -> None:
    """After a burst the pool keeps eight connections, and the server drops each one's next request; libcurl alone
    tries five of them and fails the delivery (``Connection died, tried 5 times``)."""
    async def burst_then_one_by_one() -> list[Response]:
        client = AsyncHTTP(8)
        try:
            await asyncio.gather(*[client.post(url, {}, b"{}", 5.0) for _ in range(8)])
            return [await client.post(url, {}, b"{}", 5.0) for _ in range(3)]
        finally:
            await client.close()

    assert [a.status for a in on_the_dispatchers_loop(burst_then_one_by_one())] == [200, 200, 200]
    assert DropsTheSecondRequest.seen.count(1) == 8 + 3, "each request after the burst answered on a new connection"


def test_both_clients_report_a_server_that_is_not_there() -> None:
    assert [type(a) for a in each("http://127.0.0.1:9/", {}, b"{}")] == [DeliveryError, DeliveryError]


class Records(BaseHTTPRequestHandler):
    """Answers every POST with a reply-shaped answer and keeps what each request carried."""

    protocol_version = "HTTP/1.1"
    requests: list[dict[str, str]] = []
    hang = threading.Event()  # set: answer nothing until the test is over

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.requests.append({**{k.lower(): v for k, v in self.headers.items()}, "body": body.decode()})
        if self.hang.is_set():
            self.hang.wait(30)
            return
        self.send_response(201)
        self.send_header("ce-specversion", "1.0")
        self.send_header("X-Reply", "yes")
        self.send_header("content-length", "4")
        self.end_headers()
        self.wfile.write(b"pong")

    def log_message(self, *args: Any) -> None:
        pass


def serve_records(tls: tuple[Path, Path] | None = None) -> tuple[ThreadingHTTPServer, str]:
    Records.requests = []
    Records.hang = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Records)
    server.daemon_threads = True
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"{scheme}://127.0.0.1:{server.server_address[1]}/in?x=1"


@pytest.fixture
def records() -> Iterator[str]:
    server, url = serve_records()
    yield url
    Records.hang.set()
    server.shutdown()
    server.server_close()


def each(url: str, headers: dict[str, str], body: bytes, timeout: float = 5.0) -> list[Response | Exception]:
    """The same POST by the thread client and by the loop client: each one's answer, or the error it raised."""
    answers: list[Response | Exception] = []
    thread = ThreadLocalHTTP()
    try:
        answers.append(thread.post(url, headers, body, timeout))
    except (DeliveryError, DeliveryTimeout) as exc:
        answers.append(exc)
    finally:
        thread.close()

    async def on_loop() -> Response | Exception:
        client = AsyncHTTP(4)
        try:
            return await client.post(url, headers, body, timeout)
        except (DeliveryError, DeliveryTimeout) as exc:
            return exc
        finally:
            await client.close()

    answers.append(on_the_dispatchers_loop(on_loop()))
    return answers


def both(url: str, headers: dict[str, str], body: bytes) -> list[Response]:
    """``each``, where both must answer."""
    answers = each(url, headers, body)
    assert all(isinstance(a, Response) for a in answers), answers
    return [a for a in answers if isinstance(a, Response)]


def test_both_clients_send_the_request_as_given_and_read_the_whole_answer(records: str) -> None:
    answers = both(records, {"ce-id": "e1", "content-type": "application/json"}, b'{"a":1}')
    for answer in answers:
        assert (answer.status, answer.body) == (201, b"pong")
        assert answer.headers["x-reply"] == "yes" and answer.headers["ce-specversion"] == "1.0"
    for request in Records.requests:
        assert request["body"] == '{"a":1}' and request["ce-id"] == "e1"
        assert request["content-type"] == "application/json"
    assert len(Records.requests) == 2


def test_a_large_event_goes_without_a_100_continue_round_trip(records: str) -> None:
    body = b'{"blob":"' + b"x" * (2 << 20) + b'"}'  # libcurl asks to continue for bodies over 1 MiB
    assert [a.status for a in both(records, {"content-type": "application/json"}, body)] == [201, 201]
    assert [("expect" in r, len(r["body"])) for r in Records.requests] == [(False, len(body))] * 2


def test_a_request_without_a_content_type_gets_none_from_the_client(records: str) -> None:
    both(records, {"ce-id": "e1"}, b"")
    assert [r.get("content-type") for r in Records.requests] == [None, None], "not libcurl's form type"
    assert [r["content-length"] for r in Records.requests] == ["0", "0"]


def test_a_proxy_named_in_the_environment_is_not_used(records: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    assert [a.status for a in both(records, {}, b"{}")] == [201, 201]


def test_a_subscriber_that_does_not_answer_in_time_is_a_timeout(records: str) -> None:
    Records.hang.set()
    assert [type(a) for a in each(records, {}, b"{}", 0.3)] == [DeliveryTimeout, DeliveryTimeout]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://127.0.0.1:70/", "dict://127.0.0.1:2628/d:x"])
def test_urls_of_other_schemes_are_refused(url: str) -> None:
    assert [type(a) for a in each(url, {}, b"{}", 2.0)] == [DeliveryError, DeliveryError]


def test_https_subscribers_are_verified_against_the_ca_bundle_python_uses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed(tmp_path)
    server, url = serve_records((cert, key))
    try:  # a certificate nobody trusts: refused, nothing delivered
        assert [type(a) for a in each(url, {}, b"{}")] == [DeliveryError, DeliveryError]
        assert Records.requests == []
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted as every other client of the platform trusts it
        monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "none"))
        assert [a.status for a in both(url, {}, b"{}")] == [201, 201]
    finally:
        server.shutdown()
        server.server_close()


def test_many_deliveries_in_flight_on_one_loop_each_get_their_own_answer() -> None:
    """As the dispatcher's deliverers do: each takes the next event as soon as its last is answered, so a handle
    freed by one delivery may carry the next before the first's coroutine has resumed."""
    async def many() -> list[Response]:
        client = AsyncHTTP(8)
        waiting: asyncio.Queue[int] = asyncio.Queue()
        for i in range(80):
            waiting.put_nowait(i)
        answers: list[Response] = []

        async def deliverer() -> None:
            while not waiting.empty():
                i = waiting.get_nowait()
                answers.append(await asyncio.wait_for(
                    client.post(subscriber.url("/in"), {"ce-id": f"e{i}"}, f'{{"i":{i}}}'.encode(), 5.0), 10))
        try:
            await asyncio.gather(*[deliverer() for _ in range(8)])
            return answers
        finally:
            await client.close()

    subscriber = Subscriber()
    try:
        answers = on_the_dispatchers_loop(many())
    finally:
        subscriber.close()
    assert [a.status for a in answers] == [200] * 80
    assert sorted(d.id for d in subscriber.at("/in")) == sorted(f"e{i}" for i in range(80))
    assert all(d.data == {"i": int(d.id[1:])} for d in subscriber.at("/in"))


def test_a_delivery_cancelled_in_flight_leaves_the_client_usable(records: str) -> None:
    async def cancel_then_post() -> Response:
        client = AsyncHTTP(2)
        try:
            Records.hang.set()
            task = asyncio.ensure_future(client.post(records, {}, b"{}", 30.0))
            deadline = asyncio.get_running_loop().time() + 5
            while not Records.requests:  # the request reached the server
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            Records.hang.clear()
            return await client.post(records, {}, b"{}", 5.0)
        finally:
            await client.close()

    assert on_the_dispatchers_loop(cancel_then_post()).status == 201
