"""The runtime's front door: an ASGI app that routes ``/functions/{name}`` to services.

Plain ASGI (no framework) because it sits on every request: it reads the body, asks the
service for an instance slot (waiting while a cold service starts), proxies over the
instance's UNIX socket and streams the answer back. ``GET /_runtime/services`` reports
instance counts; a ticker drives every service's autoscaler.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from serving.runtime.launcher import CommandLauncher, Launcher, TemplateLauncher
from serving.runtime.policy import ScalingPolicy
from serving.runtime.service import Overloaded, Service

log = logging.getLogger("cascade.runtime")
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}


class Runtime:
    """Every scale-to-zero service of this machine, behind one activator."""

    def __init__(self, run_dir: Path, *, tick: float = 0.2) -> None:
        self.run_dir, self.tick_seconds = run_dir, tick
        self.services: dict[str, Service] = {}
        self._ticker: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def _add(self, name: str, policy: ScalingPolicy, make: Callable[[Service], Launcher], **options: Any) -> Service:
        if name in self.services:
            raise ValueError(f"service {name!r} exists")
        service = Service(name, policy, self.run_dir / name, **options)
        service.launcher = make(service)
        self.services[name] = service
        return service

    def add_function(self, name: str, policy: ScalingPolicy, config: dict[str, Any], **options: Any) -> Service:
        """A Python handler module served by forked instances (see ``template``)."""
        return self._add(name, policy, lambda s: TemplateLauncher({**config, "name": name}, s.ready, s.exited),
                         **options)

    def add_command(self, name: str, policy: ScalingPolicy, argv: list[str], env: dict[str, str],
                    ready_path: str = "/v2/health/ready", **options: Any) -> Service:
        """Any HTTP server listening on ``$CASCADE_SOCKET`` (model servers)."""
        return self._add(name, policy, lambda s: CommandLauncher(argv, env, s.ready, s.exited, ready_path), **options)

    async def remove(self, name: str) -> None:
        service = self.services.pop(name, None)
        if service is not None and service.launcher is not None:
            await service.launcher.close()

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        for service in self.services.values():
            assert service.launcher is not None
            await service.launcher.prepare()
            initial = max(service.policy.initial_scale, service.policy.min_scale)
            if service.policy.max_scale:
                initial = min(initial, service.policy.max_scale)
            if initial:
                await service.scale_to(initial)
        self._ticker = asyncio.create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_seconds)
            for service in list(self.services.values()):
                try:
                    await service.tick()
                except Exception:
                    log.exception("autoscaling %s failed", service.name)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for service in self.services.values():
            await service.scale_to(0)
        deadline = asyncio.get_running_loop().time() + 30
        while any(s.instances for s in self.services.values()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        for service in self.services.values():
            assert service.launcher is not None
            await service.launcher.close()

    def status(self) -> list[dict[str, object]]:
        return [s.status() for s in self.services.values()]

    # -- ASGI ---------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path == "/_runtime/services":
            await _reply(send, 200, [(b"content-type", b"application/json")], json.dumps(self.status()).encode())
            return
        parts = path.split("/", 3)  # "", "functions", name, rest
        service = self.services.get(parts[2]) if len(parts) > 2 and parts[1] in ("functions", "services") else None
        if service is None:
            body = json.dumps({"error": "NotFound", "message": f"no service at {path}",
                               "services": sorted(self.services)}).encode()
            await _reply(send, 404, [(b"content-type", b"application/json")], body)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]
                   if k.decode("latin-1") not in HOP_BY_HOP]
        upstream_path = "/" + (parts[3] if len(parts) > 3 else "")
        if scope.get("query_string"):
            upstream_path += "?" + scope["query_string"].decode("latin-1")
        try:
            answer = await service.handle(scope["method"], upstream_path, headers, b"".join(chunks))
        except Overloaded as exc:
            await _reply(send, 503, [(b"retry-after", b"1")], str(exc).encode())
            return
        status = int(answer.start.split(" ", 2)[1])
        out = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers if k not in HOP_BY_HOP]
        await _reply(send, status, out, answer.body)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


async def _reply(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
