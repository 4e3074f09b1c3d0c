"""A small HTTP/1.1 client for deliveries: one keep-alive connection per thread and host.

Delivery threads POST many small requests to few hosts. A shared pool with one lock (as
httpx has) makes the threads queue for that lock; here each thread owns its connections,
so deliveries only contend for the GIL. A request on a reused connection that the server
had closed is sent once more on a fresh one.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit


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
