"""One scale-to-zero service inside the activator: its instances, its queue, its scale.

Requests take a slot on the least busy ready instance (at most ``containerConcurrency``
each). When none is free they wait in a bounded queue, and if no instance exists one is
started at once: a cold service answers late, never "not ready". Scale-down drains: the
instance gets no new requests and is stopped when its last one finishes. An instance that
dies fails its in-flight requests (502, so the caller retries) and is replaced as load
requires.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cascade.serving.runtime import http11
from cascade.serving.runtime.autoscaler import Autoscaler
from cascade.serving.runtime.launcher import Launcher
from cascade.serving.runtime.policy import ScalingPolicy
from cascade.serving.runtime.upstream import Upstream

State = Literal["starting", "ready", "draining", "gone"]


SUN_PATH_MAX = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL


def socket_path(run_dir: Path, ident: str) -> str:
    """``run_dir/ident.sock``, or a short path under the temp folder when that is too long to bind."""
    path = str(run_dir / f"{ident}.sock")
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path
    short = Path(tempfile.gettempdir()) / f"cascade-{hashlib.sha256(os.fsencode(run_dir)).hexdigest()[:12]}"
    short.mkdir(mode=0o700, exist_ok=True)
    return str(short / f"{ident}.sock")


class Overloaded(Exception):
    """The queue is full or the wait timed out (HTTP 503/504)."""


@dataclass
class Instance:
    id: str
    socket: str
    state: State = "starting"
    active: int = 0
    started: float = field(default_factory=time.monotonic)
    upstream: Upstream = field(init=False)

    def __post_init__(self) -> None:
        self.upstream = Upstream(self.socket)


class Service:
    def __init__(self, name: str, policy: ScalingPolicy, run_dir: Path, *, queue_limit: int = 10000,
                 queue_timeout: float = 300.0, request_timeout: float = 300.0) -> None:
        self.name, self.policy, self.run_dir = name, policy, run_dir
        self.queue_limit, self.queue_timeout, self.request_timeout = queue_limit, queue_timeout, request_timeout
        self.launcher: Launcher | None = None
        self.instances: dict[str, Instance] = {}
        self.waiters: deque[asyncio.Future[Instance]] = deque()
        self.autoscaler = Autoscaler(policy, time.monotonic())
        self.inflight = 0  # queued + active: the concurrency the autoscaler sees
        self._area = 0.0
        self._since = self._sampled_at = time.monotonic()
        self._ids = itertools.count(1)
        self.cold_starts = 0
        run_dir.mkdir(parents=True, exist_ok=True)

    # -- load accounting --------------------------------------------------------------
    def _account(self, delta: int) -> None:
        now = time.monotonic()
        self._area += self.inflight * (now - self._since)
        self._since, self.inflight = now, self.inflight + delta

    def hold(self, delta: int) -> None:
        """Count work that is not a request (a model warming up) as concurrency."""
        self._account(delta)

    def sample(self) -> float:
        """Time-weighted average concurrency since the last sample."""
        now = time.monotonic()
        area = self._area + self.inflight * (now - self._since)
        span = now - self._sampled_at
        self._area, self._since, self._sampled_at = 0.0, now, now
        return area / span if span > 0 else float(self.inflight)

    # -- routing ----------------------------------------------------------------------
    def _free(self) -> Instance | None:
        cc = self.policy.container_concurrency
        ready = [i for i in self.instances.values() if i.state == "ready" and (not cc or i.active < cc)]
        return min(ready, key=lambda i: i.active) if ready else None

    def live(self) -> list[Instance]:
        return [i for i in self.instances.values() if i.state in ("starting", "ready")]

    async def acquire(self) -> Instance:
        instance = self._free()
        if instance is not None and not self.waiters:
            instance.active += 1
            return instance
        if len(self.waiters) >= self.queue_limit:
            raise Overloaded(f"{self.name}: {len(self.waiters)} requests already waiting")
        future: asyncio.Future[Instance] = asyncio.get_running_loop().create_future()
        self.waiters.append(future)
        if not self.live():
            self.cold_starts += 1
            await self.scale_to(max(1, self.policy.min_scale))
        self._hand_out()
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.queue_timeout)
        except asyncio.TimeoutError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            raise Overloaded(f"{self.name}: no instance became free within {self.queue_timeout:g}s") from None
        finally:
            if future in self.waiters:
                self.waiters.remove(future)

    def _hand_out(self) -> None:
        while self.waiters:
            instance = self._free()
            if instance is None:
                return
            waiter = self.waiters.popleft()
            if waiter.done():
                continue
            instance.active += 1
            waiter.set_result(instance)

    def release(self, instance: Instance) -> None:
        instance.active -= 1
        if instance.state == "draining" and instance.active == 0:
            self._stop(instance)
        self._hand_out()

    async def handle(self, method: str, path: str, headers: list[tuple[str, str]], body: bytes) -> http11.Message:
        self._account(+1)
        try:
            instance = await self.acquire()
            try:
                return await instance.upstream.request(method, path, headers, body, self.request_timeout)
            except ConnectionError as exc:
                self._lost(instance)
                return http11.Message("HTTP/1.1 502 Bad Gateway", [("content-type", "text/plain")],
                                      f"instance {instance.id} of {self.name} failed: {exc}".encode())
            finally:
                self.release(instance)
        finally:
            self._account(-1)

    async def stream(self, method: str, path: str, headers: list[tuple[str, str]],
                     body: bytes) -> AsyncIterator[http11.Message | bytes]:
        """As ``handle``, for an answer that streams: its head, then its body's pieces as they come. The instance
        stays busy (and counted) until the last piece."""
        self._account(+1)
        try:
            instance = await self.acquire()
            started = False
            try:
                async for item in instance.upstream.stream(method, path, headers, body, self.request_timeout):
                    started = True
                    yield item
            except ConnectionError as exc:
                self._lost(instance)
                if not started:
                    yield http11.Message("HTTP/1.1 502 Bad Gateway", [("content-type", "text/plain")], b"")
                    yield f"instance {instance.id} of {self.name} failed: {exc}".encode()
            finally:
                self.release(instance)
        finally:
            self._account(-1)

    # -- instances --------------------------------------------------------------------
    async def scale_to(self, want: int) -> None:
        assert self.launcher is not None
        live = self.live()
        for _ in range(want - len(live)):
            ident = f"{self.name}-{next(self._ids)}"
            instance = Instance(ident, socket_path(self.run_dir, ident))
            Path(instance.socket).unlink(missing_ok=True)
            self.instances[ident] = instance
            address = await self.launcher.spawn(ident, instance.socket)
            if address != instance.socket:
                instance.socket, instance.upstream = address, Upstream(address)
        surplus = len(live) - want
        if surplus > 0:
            # Drain the idlest; starting ones first (they carry nothing yet).
            for instance in sorted(live, key=lambda i: (i.state == "ready", i.active))[:surplus]:
                instance.state = "draining"
                if instance.active == 0:
                    self._stop(instance)

    def _stop(self, instance: Instance) -> None:
        assert self.launcher is not None
        instance.upstream.close()
        self.launcher.terminate(instance.id)

    def ready(self, ident: str) -> None:
        instance = self.instances.get(ident)
        if instance is None:
            return
        if instance.state == "draining":
            self._stop(instance)
            return
        instance.state = "ready"
        self._hand_out()

    def exited(self, ident: str, code: int) -> None:
        instance = self.instances.pop(ident, None)
        if instance is not None:
            instance.state = "gone"
            instance.upstream.close()
            Path(instance.socket).unlink(missing_ok=True)

    def _lost(self, instance: Instance) -> None:
        """The instance stopped answering: route nothing more to it and make sure it is gone."""
        if instance.state != "draining":
            instance.state = "gone"
            assert self.launcher is not None
            self.launcher.terminate(instance.id)

    async def tick(self) -> None:
        """One autoscaler step."""
        now = time.monotonic()
        self.autoscaler.observe(now, self.sample())
        live = self.live()
        want = self.autoscaler.desired(now, len(live))
        if self.waiters and want == 0:
            want = 1
        if want != len(live):
            await self.scale_to(want)

    def status(self) -> dict[str, object]:
        counts = {s: sum(1 for i in self.instances.values() if i.state == s) for s in ("starting", "ready", "draining")}
        return {"name": self.name, **counts, "inflight": self.inflight, "queued": len(self.waiters),
                "panicking": self.autoscaler.panicking, "cold_starts": self.cold_starts}
