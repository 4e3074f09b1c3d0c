"""Serve an ASGI app from a thread of this process: the one way the platform, the CLI, the
benchmarks and the tests start a uvicorn server and stop it again."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal


class ServerThread:
    """A uvicorn server in a daemon thread; ``start`` returns once it accepts connections."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *, name: str = "asgi",
                 lifespan: Literal["auto", "on", "off"] = "on", header_timeout: float = 10.0,
                 sock: socket.socket | None = None, tls: tuple[str, str] | None = None,
                 graceful: int | None = None) -> None:
        import uvicorn  # here, so importing this module stays cheap for the CLI

        from cascade.core.httpguard import header_timeout_protocol

        self.name, self.host, self.port, self.scheme = name, host, port, "https" if tls else "http"
        protocol = header_timeout_protocol(header_timeout)
        # ``tls``: (certificate file, key file) to serve HTTPS; ``graceful``: seconds a stop waits for requests in
        # flight before cancelling them (None: as long as they take; a server with endless streams sets it)
        # no access log: its lines are below the level shown, yet each request would format one
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                                    lifespan=lifespan, http=protocol, ssl_certfile=tls[0] if tls else None,
                                                    ssl_keyfile=tls[1] if tls else None,
                                                    timeout_graceful_shutdown=graceful))
        # ``sock``: a listening socket made elsewhere (shared with other processes) instead of binding host:port
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]} if sock else {}, name=name,
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def begin(self) -> ServerThread:
        """Start without waiting (see ``started`` and ``alive``)."""
        self.thread.start()
        return self

    @property
    def started(self) -> bool:
        return bool(self.server.started)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def start(self, timeout: float = 60.0) -> ServerThread:
        self.begin()
        wait_started([self], timeout)
        return self

    def request_stop(self) -> None:
        self.server.should_exit = True

    def stop(self, timeout: float = 60.0) -> None:
        self.request_stop()
        self.thread.join(timeout)


def wait_started(servers: list[ServerThread], timeout: float = 60.0) -> None:
    """Return once every server accepts connections; RuntimeError if one died or the deadline passed."""
    deadline = time.monotonic() + timeout
    while not all(s.started for s in servers):
        dead = [s.name for s in servers if not s.alive]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"{', '.join(dead) or 'a server'} did not start (is its port in use?)")
        time.sleep(0.02)
