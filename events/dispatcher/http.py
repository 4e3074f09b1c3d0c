"""HTTP clients for deliveries: one keep-alive connection per thread and host, or aiohttp on an event loop.

Delivery threads POST many small requests to few hosts. A shared pool with one lock (as
httpx has) makes the threads queue for that lock; here each thread owns its connections,
so deliveries only contend for the GIL. A request on a reused connection that the server
had closed is sent once more on a fresh one. Many deliveries in flight are cheaper still on
one event loop: ``AsyncHTTP`` (aiohttp, whose parser is compiled) costs about a third of the CPU
per request that 64 threads on ``http.client`` do, which spend it handing the GIL around.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp


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


class ThreadLocalHTTP:
    def __init__(self) -> None:
        self._local = threading.local()
        self._context = ssl.create_default_context()

    def _connection(self, scheme: str, netloc: str, fresh: bool) -> http.client.HTTPConnection:
        pool: dict[tuple[str, str], http.client.HTTPConnection] = self._local.__dict__.setdefault("pool", {})
        key = (scheme, netloc)
        if fresh and key in pool:
            pool.pop(key).close()
        if key not in pool:
            if scheme == "https":
                pool[key] = http.client.HTTPSConnection(netloc, context=self._context)
            else:
                pool[key] = http.client.HTTPConnection(netloc)
        return pool[key]

    def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> Response:
        parts = urlsplit(url)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        for attempt in range(2):
            conn = self._connection(parts.scheme, parts.netloc, fresh=attempt > 0)
            reused = conn.sock is not None
            try:
                conn.timeout = timeout
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.request("POST", path, body=body, headers={**headers, "content-length": str(len(body))})
                raw = conn.getresponse()
                data = raw.read()
                if raw.will_close:
                    conn.close()
                return Response(raw.status, {k.lower(): v for k, v in raw.getheaders()}, data)
            except (TimeoutError, socket.timeout) as exc:
                conn.close()
                raise DeliveryTimeout(str(exc)) from exc
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                conn.close()
                if reused and attempt == 0 and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError,
                                                                 BrokenPipeError)):
                    continue  # the server closed an idle keep-alive connection
                raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in getattr(self._local, "pool", {}).values():
            conn.close()


class AsyncHTTP:
    """Deliveries from one event loop: aiohttp keeps up to ``connections`` keep-alive connections. A request that a
    server drops without an answer (a kept connection it had closed) is sent once more on a fresh connection, as
    ``ThreadLocalHTTP`` does (aiohttp itself resends only idempotent methods, and a delivery is a POST)."""

    def __init__(self, connections: int) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections, ssl=ssl.create_default_context()),
            skip_auto_headers=("User-Agent", "Content-Type"))

    async def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> Response:
        for attempt in range(2):
            try:
                async with self._session.post(url, data=body, headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=timeout)) as raw:
                    data = await raw.read()
                    return Response(raw.status, {k.lower(): v for k, v in raw.headers.items()}, data)
            except (TimeoutError, asyncio.TimeoutError) as exc:
                raise DeliveryTimeout(str(exc) or f"no response within {timeout}s") from exc
            except aiohttp.ServerDisconnectedError as exc:
                if attempt == 0:
                    continue  # the server closed a kept connection: once more, on a fresh one
                raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
        raise AssertionError("unreachable")

    async def close(self) -> None:
        await self._session.close()
