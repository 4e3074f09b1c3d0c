"""HTTP clients for deliveries, both on libcurl (pycurl): a handle per thread, or many transfers on one event loop.

A delivery is one small POST to one of few hosts, thousands a second, and the HTTP client was the
largest single cost of a delivery. libcurl builds the request, keeps the connections and parses the
answer in C, off the interpreter lock; Python only sets a handful of options and takes the headers.
Measured on the 2-core box against the same no-op subscriber, in CPU per request: 64 in flight
from one uvloop loop 39-57 us on libcurl against 97-114 us on aiohttp; one at a time 110-130 us against
aiohttp's 182-229 us and ``http.client``'s 150-164 us.

``ThreadLocalHTTP`` gives each thread its own easy handle (and so its own kept connections), so
threads only meet at the GIL. ``AsyncHTTP`` drives libcurl's multi interface from an event loop: libcurl
says which sockets to watch and when to wake it, the loop watches them (``add_reader``/``add_writer``,
``call_later``) and hands each readiness back. Both behave alike:

* a request on a kept connection that the server had closed before answering is sent once more on
  a fresh one. libcurl does this itself, for every method, but it takes the next connection from its
  pool and gives up after five. A thread's handle keeps one connection, but the loop's pool keeps as
  many as were in flight at once, and after a burst a pool the server had timed out together failed
  deliveries to a healthy subscriber (the latency bench's uvicorn, beside busy processes). So the
  loop sends a request that failed on kept connections only once more, on a new one;
* only ``http`` and ``https`` URLs are fetched, redirects are not followed, proxies named in the
  environment are not used (a subscriber is called directly, as before);
* TLS is verified against the CA bundle Python's ``ssl`` module uses (so ``SSL_CERT_FILE`` and
  ``SSL_CERT_DIR`` work as they do for every other client of the platform), not a path compiled
  into libcurl;
* libcurl's own defaults that would change a request are turned off: no ``Expect: 100-continue``
  and no form content type when the event names none.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass

import pycurl


class DeliveryTimeout(Exception):
    """No response within the timeout."""


class DeliveryError(Exception):
    """The connection failed before a response came back."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def _handle() -> pycurl.Curl:
    """An easy handle with the options every delivery shares."""
    verify = ssl.get_default_verify_paths()  # read when a handle is made: SSL_CERT_FILE as the process has it now
    curl = pycurl.Curl()
    curl.setopt(pycurl.NOSIGNAL, 1)  # timeouts without SIGALRM: safe in threads
    curl.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    curl.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
    curl.setopt(pycurl.FOLLOWLOCATION, 0)
    curl.setopt(pycurl.NOPROXY, "*")
    curl.setopt(pycurl.HTTP_VERSION, pycurl.CURL_HTTP_VERSION_1_1)
    if verify.cafile:
        curl.setopt(pycurl.CAINFO, verify.cafile)
    if verify.capath:
        curl.setopt(pycurl.CAPATH, verify.capath)
    return curl


class _Transfer:
    """One request's options on a handle, and what comes back: status line's code, headers, body."""

    def __init__(self, curl: pycurl.Curl, url: str, headers: dict[str, str], body: bytes, timeout: float) -> None:
        self.curl = curl
        self.fresh = False  # sent again on a new connection (``AsyncHTTP._fresh_again``)
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        lines = [f"{k}: {v}" for k, v in headers.items()]
        if not any(k.lower() == "content-type" for k in headers):
            lines.append("Content-Type:")  # libcurl would say application/x-www-form-urlencoded
        lines.append("Expect:")
        curl.setopt(pycurl.URL, url)
        curl.setopt(pycurl.HTTPHEADER, lines)
        curl.setopt(pycurl.POSTFIELDS, body)
        curl.setopt(pycurl.WRITEFUNCTION, self.chunks.append)
        curl.setopt(pycurl.HEADERFUNCTION, self._header)
        curl.setopt(pycurl.TIMEOUT_MS, max(1, int(timeout * 1000)))

    def _header(self, line: bytes) -> None:
        name, colon, value = line.decode("latin-1").partition(":")
        if colon:
            self.headers[name.strip().lower()] = value.strip()
        elif line.startswith(b"HTTP/"):  # a new answer (after a 100, or the one a resend got): its headers only
            self.headers.clear()

    def response(self) -> Response:
        return Response(int(self.curl.getinfo(pycurl.RESPONSE_CODE)), self.headers, b"".join(self.chunks))


def _kept_only(curl: pycurl.Curl, code: int) -> bool:
    """Whether a transfer failed as libcurl fails one that found every kept connection it tried dead (``Connection
    died, tried 5 times``), without opening one of its own."""
    return code == pycurl.E_SEND_ERROR and int(curl.getinfo(pycurl.NUM_CONNECTS)) == 0


def _failure(code: int, message: str) -> DeliveryError | DeliveryTimeout:
    if code == pycurl.E_OPERATION_TIMEDOUT:
        return DeliveryTimeout(message)
    return DeliveryError(f"curl error {code}: {message}")


class ThreadLocalHTTP:
    """Deliveries from threads: each thread posts on its own handle and keeps its own connections."""

    def __init__(self) -> None:
        self._local = threading.local()

    def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> Response:
        curl: pycurl.Curl | None = getattr(self._local, "curl", None)
        if curl is None:
            curl = self._local.curl = _handle()
        transfer = _Transfer(curl, url, headers, body, timeout)
        try:
            curl.perform()  # the GIL is released while libcurl works
        except pycurl.error as exc:
            raise _failure(*exc.args) from exc
        return transfer.response()

    def close(self) -> None:
        """Close this thread's handle and its connections."""
        curl = getattr(self._local, "curl", None)
        if curl is not None:
            curl.close()
            self._local.curl = None


class AsyncHTTP:
    """Deliveries from one event loop, up to ``connections`` at once on kept connections (more wait inside
    libcurl for one to be free). Create and use it on the loop that runs it."""

    def __init__(self, connections: int) -> None:
        self._multi = pycurl.CurlMulti()
        self._multi.setopt(pycurl.M_SOCKETFUNCTION, self._on_socket)
        self._multi.setopt(pycurl.M_TIMERFUNCTION, self._on_timer)
        self._multi.setopt(pycurl.M_MAX_TOTAL_CONNECTIONS, connections)
        self._multi.setopt(pycurl.M_MAXCONNECTS, connections)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._watched: dict[int, int] = {}  # socket -> pycurl.POLL_IN / POLL_OUT / POLL_INOUT it is watched for
        self._running: dict[pycurl.Curl, tuple[_Transfer, asyncio.Future[Response]]] = {}
        self._idle: list[pycurl.Curl] = []

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> Response:
        loop = self._loop = self._loop or asyncio.get_running_loop()
        curl = self._idle.pop() if self._idle else _handle()
        done: asyncio.Future[Response] = loop.create_future()
        self._running[curl] = (_Transfer(curl, url, headers, body, timeout), done)
        self._multi.add_handle(curl)  # libcurl asks for a timer at once, which starts the transfer
        try:
            return await done
        finally:
            mine = self._running.get(curl)  # a settled handle may already carry the next post's transfer
            if mine is not None and mine[1] is done:  # cancelled in flight: the transfer and its connection go
                del self._running[curl]
                self._multi.remove_handle(curl)
                curl.close()

    # -- libcurl asks ------------------------------------------------------------------
    def _on_socket(self, what: int, fd: int, multi: object, data: object) -> None:
        loop = self._loop
        assert loop is not None
        before = self._watched.pop(fd, 0)
        now = 0 if what == pycurl.POLL_REMOVE else what
        for bit, add, remove, ready in ((pycurl.POLL_IN, loop.add_reader, loop.remove_reader, pycurl.CSELECT_IN),
                                        (pycurl.POLL_OUT, loop.add_writer, loop.remove_writer, pycurl.CSELECT_OUT)):
            if now & bit and not before & bit:
                add(fd, self._act, fd, ready)
            elif before & bit and not now & bit:
                remove(fd)
        if now:
            self._watched[fd] = now

    def _on_timer(self, ms: int) -> None:
        assert self._loop is not None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if ms >= 0:
            self._timer = self._loop.call_later(ms / 1000, self._act, pycurl.SOCKET_TIMEOUT, 0)

    def _act(self, fd: int, event: int) -> None:
        """Let libcurl work on ``fd`` (or on its timers), then settle every transfer it finished."""
        try:
            self._multi.socket_action(fd, event)
        except pycurl.error as exc:  # the multi handle itself failed: every transfer on it has
            for curl in list(self._running):
                self._settle(curl, _failure(*exc.args))
            return
        while True:
            queued, ok, failed = self._multi.info_read()
            for curl in ok:
                self._settle(curl, None)
            for curl, code, message in failed:
                if not self._fresh_again(curl, code):
                    self._settle(curl, _failure(code, message))
            if not queued:
                return

    def _fresh_again(self, curl: pycurl.Curl, code: int) -> bool:
        """Send a transfer that found only dead kept connections once more, on a new connection."""
        transfer, done = self._running[curl]
        if transfer.fresh or done.done() or not _kept_only(curl, code):
            return False
        transfer.fresh = True
        self._multi.remove_handle(curl)
        curl.setopt(pycurl.FRESH_CONNECT, 1)
        self._multi.add_handle(curl)
        return True

    def _settle(self, curl: pycurl.Curl, error: DeliveryError | DeliveryTimeout | None) -> None:
        self._multi.remove_handle(curl)
        transfer, done = self._running.pop(curl)
        if transfer.fresh:
            curl.setopt(pycurl.FRESH_CONNECT, 0)
        self._idle.append(curl)
        if done.done():
            return
        if error is None:
            done.set_result(transfer.response())
        else:
            done.set_exception(error)

    async def close(self) -> None:
        for curl, (_, done) in list(self._running.items()):
            self._multi.remove_handle(curl)
            done.cancel()
            curl.close()
        self._running.clear()
        if self._timer is not None:
            self._timer.cancel()
        if self._loop is not None:
            for fd in self._watched:
                self._loop.remove_reader(fd)
                self._loop.remove_writer(fd)
        self._watched.clear()
        for curl in self._idle:
            curl.close()
        self._idle.clear()
        self._multi.close()
