"""A real HTTP subscriber for dispatcher tests: records every delivery, answers as told."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes
    start: float
    end: float = 0.0

    @property
    def id(self) -> str:
        return self.headers.get("ce-id", "")

    @property
    def data(self) -> Any:
        return json.loads(self.body) if self.body else None


Answer = tuple[int, dict[str, str], bytes]
Behaviour = Callable[[Delivery, int], Answer]  # (delivery, how many came to this path before) -> answer


def ok(delivery: Delivery, n: int) -> Answer:
    return 200, {}, b""


@dataclass
class Subscriber:
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)
    delay: float = 0.0
    active: int = 0
    max_active: dict[str, int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  # deliveries per path so far
    running: dict[str, int] = field(default_factory=dict)  # deliveries per path being answered now
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        subscriber = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                d = Delivery(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic())
                with subscriber.lock:  # counted per path, not by scanning every delivery (benches send thousands)
                    n = subscriber.seen.get(self.path, 0)
                    subscriber.seen[self.path] = n + 1
                    subscriber.deliveries.append(d)
                    subscriber.active += 1
                    running = subscriber.running[self.path] = subscriber.running.get(self.path, 0) + 1
                    subscriber.max_active[self.path] = max(subscriber.max_active.get(self.path, 0), running)
                try:
                    if subscriber.delay:
                        time.sleep(subscriber.delay)
                    status, headers, out = subscriber.behaviours.get(self.path, ok)(d, n)
                finally:
                    with subscriber.lock:
                        d.end = time.monotonic()
                        subscriber.active -= 1
                        subscriber.running[self.path] -= 1
                self.send_response(status)
                for k, v in {**headers, "content-length": str(len(out))}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda request, address: None  # type: ignore[method-assign]  # callers vanish
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def at(self, path: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
